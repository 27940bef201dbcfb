"""A document is read by one thread at a time, whatever messages it gets (a send that worked but
was not recorded, a cancelled upload sent again while its first message waited, the watchdog's
resend): a reader takes the document (``services.Reading``), a second message finds it held and
ends, and a reader whose process stopped renewing its lease is replaced and can write nothing
more."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError

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


def _held_by_a_dead_process(document: Document, *, state=Document.State.EXTRACTING) -> services.Reading:
    """As if a worker had taken the document and died: its token is on the row, its lease has
    run out, and no process renews it. Returns that reader, should it wake up."""
    token = uuid.uuid4()
    Document.objects.filter(pk=document.pk).update(
        reader=token, read_until=timezone.now() - timedelta(seconds=1), state=state
    )
    return services.Reading(document.pk, token)


@pytest.mark.django_db
def test_a_second_message_for_a_document_being_read_ends_without_touching_it(upload):
    with services.Reading.taken(
        upload.pk, states=[Document.State.UPLOADED], state=Document.State.EXTRACTING
    ) as reading:
        assert reading is not None
        with services.Reading.taken(upload.pk, states=[Document.State.EXTRACTING]) as second_take:
            assert second_take is None  # held

        second = services.document_ingest(document_id=upload.pk)

        assert second.state == Document.State.EXTRACTING and second.reader == reading.token
        assert second.attempts == 0  # the second message started nothing
        assert not Page.objects.filter(document=upload).exists()
        reading.write(pages_done=0)  # still the first reader's


@pytest.mark.django_db
def test_a_reading_is_renewed_by_its_process_and_the_watchdog_leaves_it_alone(upload, monkeypatch):
    from documents.tasks import ingest_document

    sent: list[int] = []
    monkeypatch.setattr(ingest_document, "delay", lambda document_id: sent.append(document_id))
    with services.Reading.taken(upload.pk, states=[Document.State.UPLOADED], state=Document.State.EMBEDDING) as reading:
        # Its process was stopped a while (a long wait for the embedder, a held process group):
        # the lease ran out on the clock, but the process still holds the reading.
        Document.objects.filter(pk=upload.pk).update(read_until=timezone.now() - timedelta(seconds=1))
        assert services.documents_dispatch_pending() == 0 and sent == []
        renewed = Document.objects.get(pk=upload.pk).read_until
        assert renewed > timezone.now() + timedelta(seconds=services.READ_LEASE_S - 10)
        reading.write(pages_done=1)
    assert services.HELD_READINGS.renew() == 0  # let go with the block


@pytest.mark.django_db
def test_a_reader_whose_lease_ran_out_is_replaced_and_then_writes_nothing(upload):
    stale = _held_by_a_dead_process(upload)

    done = services.document_ingest(document_id=upload.pk)  # the message the watchdog sent again

    assert done.state == Document.State.READY and done.reader is None and done.read_until is None
    chunks = Chunk.objects.filter(document=upload).count()
    assert chunks > 0
    # The old reader wakes up: none of its writes lands, whatever it tries.
    with pytest.raises(services.ReadingLost):
        stale.write(pages_done=0)
    assert stale.end(Document.State.FAILED, failure_reason="the old reader failed") is False
    services.document_fail(stale, reason="the old reader failed")
    services._document_cancelled(stale)
    after = Document.objects.get(pk=upload.pk)
    assert after.state == Document.State.READY and after.failure_reason == ""
    assert Chunk.objects.filter(document=upload).count() == chunks


@pytest.mark.django_db
def test_an_old_reader_cannot_store_its_pages_over_the_new_readers(upload):
    from documents.extraction import ExtractedDocument, ExtractedPage

    stale = _held_by_a_dead_process(upload)
    with services.Reading.taken(upload.pk, states=[Document.State.EXTRACTING]) as reading:
        assert reading is not None
        mine = ExtractedDocument(kind=Document.Kind.TEXT, pages=[ExtractedPage(text="The new reader's page.")])
        services._store_pages(upload, mine, reading)
        theirs = ExtractedDocument(kind=Document.Kind.TEXT, pages=[ExtractedPage(text="The old reader's page.")] * 3)
        with pytest.raises(services.ReadingLost):
            services._store_pages(upload, theirs, stale)
    assert list(Page.objects.filter(document=upload).values_list("text", flat=True)) == ["The new reader's page."]
    assert Document.objects.get(pk=upload.pk).pages_total == 1


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
def test_the_watchdog_sends_again_a_document_whose_lease_ran_out_once_and_no_other(alice, upload, monkeypatch):
    from documents.tasks import ingest_document

    sent: list[int] = []
    monkeypatch.setattr(ingest_document, "delay", lambda document_id: sent.append(document_id))
    dead = _held_by_a_dead_process(upload)
    other = Document.objects.create(
        owner=alice, title="b", filename="b.txt", size_bytes=1, sha256="b" * 64, file="documents/b.txt"
    )
    # Another process's reading, quiet for a while but still within its lease.
    Document.objects.filter(pk=other.pk).update(
        state=Document.State.EMBEDDING, reader=uuid.uuid4(), read_until=timezone.now() + timedelta(seconds=30)
    )

    assert services.documents_dispatch_pending() == 1
    assert sent == [upload.pk]
    marked = Document.objects.get(pk=upload.pk)
    assert marked.reader is None  # the resend's reader may take it
    assert marked.read_until > timezone.now() + timedelta(seconds=services.RESEND_AFTER_S - 10)
    assert services.documents_dispatch_pending() == 0  # not at every sweep while its message waits
    assert sent == [upload.pk]
    with pytest.raises(services.ReadingLost):
        dead.write()
    # Nobody took it in time (the message was lost): it is sent once more.
    Document.objects.filter(pk=upload.pk).update(read_until=timezone.now() - timedelta(seconds=1))
    assert services.documents_dispatch_pending() == 1 and sent == [upload.pk, upload.pk]
    assert services.document_ingest(document_id=upload.pk).state == Document.State.READY


@pytest.mark.django_db
def test_a_document_being_read_before_readings_had_leases_is_sent_again(upload, monkeypatch):
    from documents.tasks import ingest_document

    sent: list[int] = []
    monkeypatch.setattr(ingest_document, "delay", lambda document_id: sent.append(document_id))
    Document.objects.filter(pk=upload.pk).update(state=Document.State.EMBEDDING, reader=None, read_until=None)
    assert services.documents_dispatch_pending() == 1 and sent == [upload.pk]
    assert services.document_ingest(document_id=upload.pk).state == Document.State.READY


@pytest.mark.django_db
def test_a_reading_held_past_the_time_limit_is_no_longer_renewed(upload, monkeypatch):
    """A reader stuck in a wait that never ends lets its document go at the lease's end."""
    with services.Reading.taken(upload.pk, states=[Document.State.UPLOADED], state=Document.State.EXTRACTING):
        assert services.HELD_READINGS.renew() == 1
        monkeypatch.setattr(services, "INGEST_TIME_LIMIT_S", -services.READ_LEASE_S - 1)  # as if taken long ago
        assert services.HELD_READINGS.renew() == 0


@pytest.mark.django_db
def test_a_lapsed_reading_the_broker_refuses_to_send_is_tried_again_at_the_next_sweep(upload, monkeypatch):
    from documents.tasks import ingest_document

    def refuse(document_id):
        raise OperationalError("the broker is away")

    monkeypatch.setattr(ingest_document, "delay", refuse)
    _held_by_a_dead_process(upload)
    assert services.documents_dispatch_pending() == 0
    sent: list[int] = []
    monkeypatch.setattr(ingest_document, "delay", lambda document_id: sent.append(document_id))
    assert services.documents_dispatch_pending() == 1 and sent == [upload.pk]


@pytest.mark.django_db
def test_a_file_whose_reader_died_on_it_again_and_again_is_given_up_with_a_reason(upload, monkeypatch):
    from documents.tasks import ingest_document

    monkeypatch.setattr(ingest_document, "delay", lambda document_id: None)
    for _ in range(services.MAX_INGEST_ATTEMPTS):  # taken, then its worker died mid-way
        Document.objects.filter(pk=upload.pk).update(attempts=F("attempts") + 1)
        _held_by_a_dead_process(upload)
        assert services.documents_dispatch_pending() == 1

    failed = services.document_ingest(document_id=upload.pk)

    assert failed.state == Document.State.FAILED and failed.reader is None
    assert f"stopped the worker {services.MAX_INGEST_ATTEMPTS} times" in failed.failure_reason
    assert not Page.objects.filter(document=upload).exists()


@pytest.mark.django_db
def test_a_ready_document_being_re_embedded_is_re_embedded_once(upload):
    services.document_ingest(document_id=upload.pk)
    before = list(Chunk.objects.filter(document=upload).values_list("pk", flat=True))
    with services.Reading.taken(upload.pk, states=[Document.State.READY]) as reading:
        assert reading is not None
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
    """The reader's worker died after taking it: nothing will come for it but the watchdog."""
    _held_by_a_dead_process(upload)
    ready = wait_until(
        lambda: (d := Document.objects.get(pk=upload.pk)).state == Document.State.READY and d,
        timeout_s=services.DISPATCH_GRACE_S + 120,
        message="the abandoned document read again after the watchdog's send",
    )
    assert ready.reader is None and Chunk.objects.filter(document=ready).exists()
    assert [p.document_id for p in search_passages(user=alice, query="three months' written notice", limit=3)] == [
        ready.pk
    ]
