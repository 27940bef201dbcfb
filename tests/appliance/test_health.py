"""/healthz against real services: a broker that stops is reported down, with a 503."""

from __future__ import annotations

import socket

import pytest
from django.test import Client

from appliance.embedded import EmbeddedValkey

pytestmark = pytest.mark.django_db


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def own_broker(tmp_path, settings):
    """A real Valkey of this test's own, so that stopping it disturbs nothing else."""
    valkey = EmbeddedValkey(data_dir=tmp_path / "valkey", port=_free_port())
    valkey.start()
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{valkey.port}/0"
    yield valkey
    valkey.stop()


def test_healthz_reports_a_stopped_broker_as_down(own_broker):
    client = Client()
    before = client.get("/healthz").json()
    assert before["broker"]["ok"] is True
    assert before["database"]["ok"] is True and before["database"]["pgvector"]

    own_broker.stop()
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "degraded"
    assert body["broker"]["ok"] is False and body["broker"]["detail"]
    assert body["workers"]["ok"] is False  # nobody can reach the workers without a broker
    assert body["database"]["ok"] is True  # the other parts are still reported truthfully


def test_healthz_reports_a_missing_engine_host(settings, tmp_path):
    settings.APPLIANCE_ENGINE_SOCKET = tmp_path / "nothing-listens-here.sock"
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["engine"]["ok"] is False
    assert "not answering" in response.json()["engine"]["detail"]
