"""A batch is settled, in one statement, when its last document finishes."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from documents import services
from documents.models import Batch, Document

pytestmark = pytest.mark.django_db


def _batch(owner, state: str, document_states: list[str]) -> Batch:
    batch = Batch.objects.create(owner=owner, name="3 files", state=state, files_total=len(document_states))
    for index, document_state in enumerate(document_states):
        Document.objects.create(
            owner=owner, batch=batch, title=f"f{index}", filename=f"f{index}.txt", size_bytes=1,
            sha256=f"{batch.pk}-{index}".ljust(64, "0"), file=f"documents/f{index}.txt", state=document_state,
        )  # fmt: skip
    return batch


def test_a_batch_ends_finished_or_stays_cancelled_with_its_time_once_nothing_in_it_is_unfinished(alice):
    ready, failed, reading = Document.State.READY, Document.State.FAILED, Document.State.EMBEDDING
    running = _batch(alice, Batch.State.RUNNING, [ready, failed])
    cancelled = _batch(alice, Batch.State.CANCELLED, [ready, Document.State.CANCELLED])
    unfinished = _batch(alice, Batch.State.RUNNING, [ready, reading])
    for batch in (running, cancelled, unfinished):
        with CaptureQueriesContext(connection) as queries:
            services.batch_settle(batch_id=batch.pk)
        # Its state and end time in one statement: as two, a settle racing another document's
        # could see that document unfinished for the state and finished for the time.
        assert [q["sql"].split()[0] for q in queries.captured_queries] == ["UPDATE"]
        batch.refresh_from_db()
    assert running.state == Batch.State.FINISHED and running.finished_at is not None
    assert cancelled.state == Batch.State.CANCELLED and cancelled.finished_at is not None
    assert unfinished.state == Batch.State.RUNNING and unfinished.finished_at is None
    finished_at = running.finished_at
    services.batch_settle(batch_id=running.pk)  # settled once: a later document's settle leaves it
    running.refresh_from_db()
    assert running.finished_at == finished_at
