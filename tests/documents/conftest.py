"""Fixtures of the documents tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def queued(monkeypatch) -> list[int]:
    """For the tests of what is queued (a poll, a batch), without the worker: the documents a poll queues
    are listed here, not sent, since this test's transaction commits and an ingest worker left
    running by another test of the session would start reading them while the test database is
    emptied (the race ``test_batches_api`` met). Ingestion is tested with the real worker."""
    from documents import services

    ids: list[int] = []
    monkeypatch.setattr(services, "_dispatch_upload", lambda document: ids.append(document.pk))
    return ids
