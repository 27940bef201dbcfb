"""A broker that may have lost its queues, against real Valkey servers of the test's own: one
that comes back empty (an external Redis without persistence restarted) and one restarted on its
data (which may have lost its last second). The watchdogs find their mark gone or naming another
run of the server, and every waiting job and document is sent again; nothing else is. What is
sent is recorded by fakes of the publishers (the Celery app's own broker is the session's)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.db.models import QuerySet
from django.utils import timezone

from appliance.broker import PUBLISH_ERRORS
from appliance.credentials import EmbeddedCredentials
from appliance.embedded import EmbeddedValkey, free_port
from documents import services as documents
from documents import tasks as document_tasks
from documents.embeddings import model_path as embedding_model_path
from documents.models import Document
from inference import lifecycle
from inference import tasks as job_tasks
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
    published: list[tuple[str, object]] = []
    monkeypatch.setattr(document_tasks.ingest_document, "delay", lambda pk: published.append(("document", pk)))
    monkeypatch.setattr(document_tasks.embed_document, "delay", lambda pk: published.append(("re-embed", pk)))
    monkeypatch.setattr(lifecycle, "_publish_turn", lambda job_id, **kwargs: published.append(("job", str(job_id))))
    return published


def _look() -> tuple[int, int]:
    return lifecycle.jobs_unsent_if_the_broker_forgot(), documents.documents_unsent_if_the_broker_forgot()


def _sweeps() -> None:
    """The two watchdogs' rounds, as their threads run them (the running jobs' workers beat
    meanwhile: a slow test outlasts the heartbeat timeout)."""
    Job.objects.filter(state=Job.State.RUNNING).update(heartbeat_at=timezone.now())
    job_tasks._sweep()
    document_tasks._sweep()


def test_a_broker_that_lost_its_queues_gets_every_waiting_job_and_document_sent_again(alice, brokers, sent):
    kept, empty = brokers
    _look()  # the watchdogs' first look at this broker leaves their marks
    assert _look() == (0, 0)  # and while it runs on, nothing is sent again
    old, now = timezone.now() - timedelta(minutes=5), timezone.now()

    def job(**fields) -> Job:
        row = Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, options={}, **fields)
        Job.objects.filter(pk=row.pk).update(created_at=old, dispatched_at=old)
        return row

    queued = job()
    waiting_for_the_engine = job(not_before=now + timedelta(seconds=20))
    running = job(state=Job.State.RUNNING, claimed_at=now, started_at=now, heartbeat_at=now)
    finished = job(state=Job.State.SUCCEEDED)

    def document(name: str, state, **fields) -> Document:
        row = Document.objects.create(owner=alice, title=name, filename=name, size_bytes=1,
                                      sha256=name.ljust(64, "0"), file=f"documents/{name}")  # fmt: skip
        Document.objects.filter(pk=row.pk).update(state=state, updated_at=old, dispatched_at=old, **fields)
        return row

    waiting = document("waiting.txt", Document.State.UPLOADED)
    handed_on = document("handed-on.txt", Document.State.EXTRACTING, read_until=now + timedelta(minutes=9))
    being_read = document("being-read.txt", Document.State.EMBEDDING, reader=uuid.uuid4(),
                          read_until=now + timedelta(minutes=1))  # fmt: skip
    ready = document("ready.txt", Document.State.READY, embedding_model=embedding_model_path()[1])
    stale = document("stale.txt", Document.State.READY, embedding_model="an-older-model")  # its re-embedding is queued
    expected = sorted([("job", str(queued.pk)), ("job", str(waiting_for_the_engine.pk)), ("document", waiting.pk),
                       ("document", handed_on.pk), ("re-embed", stale.pk)], key=str)  # fmt: skip

    def ours() -> list[tuple[str, object]]:  # rows other tests left in the database are not this test's
        return sorted(((kind, pk) for kind, pk in sent if (Job if kind == "job" else Document).objects.filter(
            pk=pk, owner=alice).exists()), key=str)  # fmt: skip

    kept.stop()
    empty.start()  # the queues are gone, and the marks with them
    _sweeps()
    assert ours() == expected
    assert Job.objects.get(pk=queued.pk).dispatched_at > old  # recorded as sent anew
    assert Job.objects.get(pk=running.pk).state == Job.State.RUNNING  # its worker has it
    assert Document.objects.get(pk=being_read.pk).reader is not None  # its reader has it
    assert (
        Job.objects.get(pk=finished.pk).dispatched_at == old and Document.objects.get(pk=ready.pk).dispatched_at == old
    )
    sent.clear()
    _sweeps()
    assert ours() == []  # once per loss

    empty.stop()
    empty.start()  # restarted on its data: what it wrote in its last second may be gone
    _sweeps()
    assert ours() == expected


def test_a_look_that_fails_before_the_rows_are_marked_leaves_the_loss_to_the_next(alice, brokers, sent, monkeypatch):
    kept, empty = brokers
    _look()
    Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, options={}, dispatched_at=timezone.now())
    kept.stop()
    empty.start()
    with monkeypatch.context() as patched:  # the database goes away just then
        patched.setattr(QuerySet, "update", lambda *args, **kwargs: (_ for _ in ()).throw(OperationalError("gone")))
        with pytest.raises(OperationalError):
            lifecycle.jobs_unsent_if_the_broker_forgot()
    assert lifecycle.jobs_unsent_if_the_broker_forgot() == 1


def test_while_the_broker_is_down_the_watchdog_round_fails_and_marks_nothing(alice, brokers, sent):
    kept, _ = brokers
    _look()
    Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, options={}, dispatched_at=timezone.now())
    kept.stop()
    with pytest.raises(PUBLISH_ERRORS):
        lifecycle.jobs_unsent_if_the_broker_forgot()
    assert not Job.objects.filter(dispatched_at=None).exists()
