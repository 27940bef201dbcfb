from __future__ import annotations

import pytest

from tests.appliance.fake_engine import FakeEngineHost


@pytest.fixture
def fake_engine(settings):
    """A fake engine host the appliance's settings point at; the test sets what it answers."""
    fake = FakeEngineHost().start()
    settings.APPLIANCE_ENGINE_SOCKET = fake.socket_path
    yield fake
    fake.stop()
