"""A document is read by one thread at a time, whatever messages it gets (a send that worked but
was not recorded, a cancelled upload sent again while its first message waited, the watchdog's
resend): a reader takes the document (``services.Reading``), a second message finds it held and
ends, and a reader silent past its lease is replaced and can write nothing more."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.utils import timezone

from documents import services
from documents.models import Chunk, Document, Page
from documents.search import search_passages
from tests.conftest import wait_until

TEXT = (
    b"The tenant shall keep the premises at 14 Harbour Road in good repair.\n"
    b"Rent of 2,400 pounds is due on the first day of each month.\n"
    b"Either party may end this lease on three months' written notice.\n"
)


@pytest.fixture
def upload(alice, monkeypatch, django_capture_on_commit_callbacks):
    """An upload, stored and committed, whose message the test delivers itself (a fake broker
    records the sends)."""
    from documents.tasks import ingest_document

    monkeypatch.setattr(services, "broker_check", lambda: None)
    monkeypatch.setattr(ingest_document, "delay", lambda document_id: None)
    with django_capture_on_commit_callbacks(execute=True):
        document, created = services.document_create(owner=alice, upload=SimpleUploadedFile("lease.txt", TEXT))
    assert created and document.state == Document.State.UPLOADED
    return document


def _silent(reading: services.Reading, *, for_s: float) -> None:
    """As if the reader holding the document had given no sign of life for ``for_s`` seconds."""
    Document.objects.filter(pk=reading.document_id).update(
        read_until=timezone.now() + timedelta(seconds=services.read_lease_s() - for_s)
    )


@pytest.mark.django_db
def test_a_second_message_for_a_document_being_read_ends_without_touching_it(upload):
    reading = services.Reading.take(upload.pk, states=[Document.State.UPLOADED], state=Document.State.EXTRACTING)
    assert reading is not None
    assert services.Reading.take(upload.pk, states=[Document.State.EXTRACTING]) is None  # held

    second = services.document_ingest(document_id=upload.pk)

    assert second.state == Document.State.EXTRACTING and second.reader == reading.token
    assert second.attempts == 0  # the second message started nothing
    assert not Page.objects.filter(document=upload).exists()
    reading.write(pages_done=0)  # still the first reader's


@pytest.mark.django_db
def test_a_reader_silent_past_its_lease_is_replaced_and_then_writes_nothing(upload):
    stale = services.Reading.take(upload.pk, states=[Document.State.UPLOADED], state=Document.State.EXTRACTING)
    _silent(stale, for_s=services.read_lease_s() + 1)

    done = services.document_ingest(document_id=upload.pk)  # the message the watchdog sent again

    assert done.state == Document.State.READY and done.reader is None and done.read_until is None
    chunks = Chunk.objects.filter(document=upload).count()
    assert chunks > 0
    # The old reader wakes up: none of its writes lands, whatever it tries.
    with pytest.raises(services.ReadingLost):
        stale.write(pages_done=0)
    assert stale.end(Document.State.FAILED, failure_reason="the old reader failed") is False
    services.document_fail(document_id=upload.pk, reason="the old reader failed", reading=stale)
    services._document_cancelled(stale)
    after = Document.objects.get(pk=upload.pk)
    assert after.state == Document.State.READY and after.failure_reason == ""
    assert Chunk.objects.filter(document=upload).count() == chunks


@pytest.mark.django_db
def test_a_failure_outside_any_reading_does_not_end_the_reading_in_progress(upload):
    reading = services.Reading.take(upload.pk, states=[Document.State.UPLOADED], state=Document.State.EXTRACTING)
    services.document_fail(document_id=upload.pk, reason="a task that broke before it took the document")
    assert Document.objects.get(pk=upload.pk).state == Document.State.EXTRACTING
    _silent(reading, for_s=services.read_lease_s() + 1)  # its reader died: now it may be failed
    services.document_fail(document_id=upload.pk, reason="a task that broke before it took the document")
    assert Document.objects.get(pk=upload.pk).state == Document.State.FAILED


@pytest.mark.django_db(transaction=True)
def test_two_messages_delivered_at_once_read_the_document_once(upload, monkeypatch):
    """Two threads of the ingest worker get the same document's message at the same moment."""
    from documents import sandbox

    extractions: list[str] = []
    extract = sandbox.extract_in_sandbox

    def counted(data, **kwargs):  # the real extraction, counted
        extractions.append(kwargs["filename"])
        return extract(data, **kwargs)

    monkeypatch.setattr(sandbox, "extract_in_sandbox", counted)
    start = threading.Barrier(2)
    results: list[Document | None] = []

    def deliver() -> None:
        try:
            start.wait()
            results.append(services.document_ingest(document_id=upload.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(results) == 2
    assert extractions == ["lease.txt"]  # one of the two read it
    document = Document.objects.get(pk=upload.pk)
    assert document.state == Document.State.READY
    assert document.attempts == 0 and document.reader is None  # reset when ready
    indexes = list(Chunk.objects.filter(document=upload).values_list("index", flat=True))
    assert indexes and len(indexes) == len(set(indexes))
    assert [p.document_id for p in search_passages(user=upload.owner, query="Harbour Road repair", limit=3)] == [
        upload.pk
    ]


@pytest.mark.django_db
def test_the_watchdog_sends_again_a_document_whose_reader_fell_silent_once_and_no_other(alice, upload, monkeypatch):
    from documents.tasks import ingest_document

    sent: list[int] = []
    monkeypatch.setattr(ingest_document, "delay", lambda document_id: sent.append(document_id))
    silent = services.Reading.take(upload.pk, states=[Document.State.UPLOADED], state=Document.State.EXTRACTING)
    _silent(silent, for_s=services.read_lease_s() + 1)
    other = Document.objects.create(
        owner=alice, title="b", filename="b.txt", size_bytes=1, sha256="b" * 64, file="documents/b.txt"
    )
    alive = services.Reading.take(other.pk, states=[Document.State.UPLOADED], state=Document.State.EMBEDDING)
    _silent(alive, for_s=services.read_lease_s() - 60)  # quiet for a while, still within its lease

    assert services.documents_dispatch_pending() == 1
    assert sent == [upload.pk]
    marked = Document.objects.get(pk=upload.pk)
    assert marked.reader is None and marked.read_until > timezone.now()  # the resend's reader may take it
    assert services.documents_dispatch_pending() == 0  # sent once, not at every sweep
    with pytest.raises(services.ReadingLost):
        silent.write()
    assert services.document_ingest(document_id=upload.pk).state == Document.State.READY


@pytest.mark.django_db
def test_a_file_whose_reader_died_on_it_again_and_again_is_given_up_with_a_reason(upload):
    for _ in range(services.MAX_INGEST_ATTEMPTS):  # each time its worker died mid-way
        reading = services.Reading.take(
            upload.pk, states=[Document.State.UPLOADED, Document.State.EXTRACTING], attempts=1 + upload.attempts
        )
        upload.attempts += 1
        _silent(reading, for_s=services.read_lease_s() + 1)
        Document.objects.filter(pk=upload.pk).update(state=Document.State.EXTRACTING)

    failed = services.document_ingest(document_id=upload.pk)

    assert failed.state == Document.State.FAILED and failed.reader is None
    assert f"stopped the worker {services.MAX_INGEST_ATTEMPTS} times" in failed.failure_reason
    assert not Page.objects.filter(document=upload).exists()


@pytest.mark.django_db
def test_a_ready_document_being_re_embedded_is_re_embedded_once(upload):
    services.document_ingest(document_id=upload.pk)
    reading = services.Reading.take(upload.pk, states=[Document.State.READY])
    before = list(Chunk.objects.filter(document=upload).values_list("pk", flat=True))
    services.document_embed(document_id=upload.pk)  # a second re-embedding message
    assert list(Chunk.objects.filter(document=upload).values_list("pk", flat=True)) == before
    reading.end(Document.State.READY)
    services.document_embed(document_id=upload.pk)
    after = Document.objects.get(pk=upload.pk)
    assert after.state == Document.State.READY and after.reader is None
    assert set(Chunk.objects.filter(document=upload).values_list("pk", flat=True)).isdisjoint(before)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_document_whose_worker_died_mid_read_is_finished_by_the_live_ingest_worker(alice, upload, workers):
    """The reader's worker died after extracting it: nothing will come for it but the watchdog."""
    dead = services.Reading.take(upload.pk, states=[Document.State.UPLOADED], state=Document.State.EXTRACTING)
    _silent(dead, for_s=services.read_lease_s() + 1)
    ready = wait_until(
        lambda: (d := Document.objects.get(pk=upload.pk)).state == Document.State.READY and d,
        timeout_s=services.DISPATCH_GRACE_S + 120,
        message="the abandoned document read again after the watchdog's send",
    )
    assert ready.reader is None and Chunk.objects.filter(document=ready).exists()
    assert [p.document_id for p in search_passages(user=alice, query="three months' written notice", limit=3)] == [
        ready.pk
    ]
