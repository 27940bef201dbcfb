"""A broker that lost its queues (an external Redis without persistence restarted) against real
Valkey servers of the test's own: the watchdogs find their mark gone and every waiting job and
document is sent again; a restart that kept its data (the embedded Valkey's append-only file)
sends nothing twice. What is sent is recorded by fakes of the publishers (the Celery app's own
broker is the session's)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from appliance.broker import PUBLISH_ERRORS
from appliance.credentials import EmbeddedCredentials
from appliance.embedded import EmbeddedValkey, free_port
from documents import services as documents
from documents.models import Document
from inference import lifecycle
from inference.models import Job, JobKind, Queue

pytestmark = pytest.mark.django_db


@pytest.fixture
def brokers(tmp_path, settings):
    """Two real Valkeys on one port and password, one at a time: ``kept`` (its data on disk, as
    the embedded one) and ``empty`` (another directory: what a Redis without persistence is
    after a restart)."""
    port, credentials = free_port(), EmbeddedCredentials.of(tmp_path)
    kept = EmbeddedValkey(data_dir=tmp_path / "kept", port=port, credentials=credentials)
    empty = EmbeddedValkey(data_dir=tmp_path / "empty", port=port, credentials=credentials)
    kept.start()
    settings.CELERY_BROKER_URL = kept.url
    yield kept, empty
    kept.stop()
    empty.stop()


@pytest.fixture
def sent(monkeypatch):
    """The publishers of job turns and ingestions, recorded instead of sent (fakes)."""
    from documents.tasks import ingest_document

    published: list[tuple[str, object]] = []
    monkeypatch.setattr(ingest_document, "delay", lambda document_id: published.append(("document", document_id)))
    monkeypatch.setattr(lifecycle, "_publish_turn", lambda job_id, **kwargs: published.append(("job", str(job_id))))
    return published


def _look() -> tuple[int, int]:
    return lifecycle.jobs_unsent_if_the_broker_forgot(), documents.documents_unsent_if_the_broker_forgot()


def test_a_broker_that_lost_its_queues_gets_every_waiting_job_and_document_sent_again(alice, brokers, sent):
    kept, empty = brokers
    _look()  # the watchdogs' first look at this broker leaves their marks
    old = timezone.now() - timedelta(minutes=5)
    queued = Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, options={}, dispatched_at=old)
    running = Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, options={},
                                 state=Job.State.RUNNING, dispatched_at=old)  # fmt: skip
    Job.objects.filter(pk__in=[queued.pk, running.pk]).update(created_at=old)

    def document(name: str, state, **fields) -> Document:
        row = Document.objects.create(owner=alice, title=name, filename=name, size_bytes=1,
                                      sha256=name.ljust(64, "0"), file=f"documents/{name}")  # fmt: skip
        Document.objects.filter(pk=row.pk).update(state=state, updated_at=old, dispatched_at=old, **fields)
        return row

    waiting = document("waiting.txt", Document.State.UPLOADED)
    handed_on = document("handed-on.txt", Document.State.EXTRACTING, read_until=timezone.now() + timedelta(minutes=9))
    being_read = document("being-read.txt", Document.State.EMBEDDING, reader=uuid.uuid4(),
                          read_until=timezone.now() + timedelta(minutes=1))  # fmt: skip

    kept.stop()
    kept.start()  # a restart that kept its data: nothing was lost, nothing is sent again
    assert _look() == (0, 0)
    assert lifecycle.jobs_dispatch_pending() == 0 and documents.documents_dispatch_pending() == 0
    assert sent == []

    kept.stop()
    empty.start()  # the queues are gone, and the marks with them
    assert _look() == (1, 2)
    assert _look() == (0, 0)  # once per loss
    assert lifecycle.jobs_dispatch_pending() == 1
    assert documents.documents_dispatch_pending() == 2
    assert sorted(sent, key=str) == sorted([("job", str(queued.pk)), ("document", waiting.pk),
                                            ("document", handed_on.pk)], key=str)  # fmt: skip
    assert Job.objects.get(pk=queued.pk).dispatched_at is not None  # recorded as sent, once
    assert lifecycle.jobs_dispatch_pending() == 0 and documents.documents_dispatch_pending() == 0
    assert Job.objects.get(pk=running.pk).state == Job.State.RUNNING  # its worker has it
    assert Document.objects.get(pk=being_read.pk).reader is not None  # its reader has it


def test_while_the_broker_is_down_the_watchdog_round_fails_and_marks_nothing(alice, brokers):
    kept, _ = brokers
    _look()
    Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, options={}, dispatched_at=timezone.now())
    kept.stop()
    with pytest.raises(PUBLISH_ERRORS):
        lifecycle.jobs_unsent_if_the_broker_forgot()
    assert not Job.objects.filter(dispatched_at=None).exists()
