"""An upload whose ingestion was never sent (its web process died between the commit and the send)
is sent by the ingest worker's watchdog, once; nothing stays *Uploaded* for ever."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone
from kombu.exceptions import OperationalError

from documents import services
from documents.models import Chunk, Document
from documents.search import search_passages
from tests.conftest import wait_until


def _document(owner, name: str, *, state=Document.State.UPLOADED, stored_s_ago: float = 0, sent: bool = False):
    document = Document.objects.create(
        owner=owner, title=name, filename=name, size_bytes=10, sha256=name.ljust(64, "0"), file=f"documents/{name}"
    )
    at = timezone.now() - timedelta(seconds=stored_s_ago)
    Document.objects.filter(pk=document.pk).update(state=state, updated_at=at, dispatched_at=at if sent else None)
    return document


@pytest.fixture
def sent(monkeypatch):
    """The ingestions the watchdog publishes, recorded instead of sent (a fake broker)."""
    from documents.tasks import ingest_document

    published: list[int] = []
    monkeypatch.setattr(ingest_document, "delay", lambda document_id: published.append(document_id))
    return published


@pytest.mark.django_db
def test_the_watchdog_sends_an_upload_never_sent_once_and_nothing_else(alice, sent):
    old = services.DISPATCH_GRACE_S + 5
    lost = _document(alice, "lost.txt", stored_s_ago=old)  # committed, then its sender died
    fresh = _document(alice, "fresh.txt")  # its web process may still be sending it
    queued = _document(alice, "queued.txt", stored_s_ago=old, sent=True)  # waits in the queue
    reading = _document(alice, "reading.txt", state=Document.State.EXTRACTING, stored_s_ago=old)
    Document.objects.filter(pk=reading.pk).update(  # a live reader holds it
        reader=uuid.uuid4(), read_until=timezone.now() + timedelta(seconds=60)
    )
    assert services.documents_dispatch_pending() == 1
    assert sent == [lost.pk]
    assert Document.objects.get(pk=lost.pk).dispatched_at is not None
    assert Document.objects.get(pk=fresh.pk).dispatched_at is None
    assert services.documents_dispatch_pending() == 0  # sent once, not at every sweep
    assert sent == [lost.pk]
    assert {queued.pk, reading.pk}.isdisjoint(sent)


@pytest.mark.django_db
def test_what_is_sent_as_it_is_made_is_recorded_and_never_sent_again(
    alice, sent, monkeypatch, django_capture_on_commit_callbacks
):
    """An upload, the same file uploaded again after its reading was cancelled, and an e-mail's
    attachment: each records its send, so the watchdog leaves it alone however long it waits."""
    from types import SimpleNamespace

    monkeypatch.setattr(services, "broker_check", lambda: None)  # the fake broker above takes everything
    data = b"Either party may end this agreement on ninety days' notice.\n"
    with django_capture_on_commit_callbacks(execute=True):
        upload, created = services.document_create(owner=alice, upload=SimpleUploadedFile("notice.txt", data))
    assert created and sent == [upload.pk]
    services.document_cancel(document=upload, user=alice)
    with django_capture_on_commit_callbacks(execute=True):
        again, requeued = services.document_create(owner=alice, upload=SimpleUploadedFile("notice.txt", data))
    assert requeued and again.pk == upload.pk and sent == [upload.pk, upload.pk]
    attachment = SimpleNamespace(filename="schedule.txt", content_type="text/plain", data=b"Schedule 1: prices.\n")
    with django_capture_on_commit_callbacks(execute=True):
        child = services._create_child(upload, attachment)
    assert sent == [upload.pk, upload.pk, child.pk]
    documents = Document.objects.filter(pk__in=[upload.pk, child.pk])
    assert all(d.dispatched_at is not None and d.state == Document.State.UPLOADED for d in documents)
    documents.update(updated_at=timezone.now() - timedelta(days=1))
    assert services.documents_dispatch_pending() == 0
    assert sent == [upload.pk, upload.pk, child.pk]


@pytest.mark.django_db
def test_an_upload_the_broker_refuses_to_the_watchdog_waits_for_the_next_sweep(alice, monkeypatch):
    from documents.tasks import ingest_document

    def refuse(document_id):
        raise OperationalError("the broker is away")

    monkeypatch.setattr(ingest_document, "delay", refuse)
    lost = _document(alice, "lost.txt", stored_s_ago=services.DISPATCH_GRACE_S + 5)
    assert services.documents_dispatch_pending() == 0
    assert Document.objects.get(pk=lost.pk).dispatched_at is None  # given back, tried again later


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_an_upload_whose_web_process_died_before_sending_it_is_read_all_the_same(browser, alice, workers, monkeypatch):
    # The web process stores the upload and commits, then dies before it sends the ingestion.
    monkeypatch.setattr(services, "_dispatch_upload", lambda document: None)
    text = b"The supplier shall deliver the goods to the warehouse in Leith within thirty days of each order.\n"
    response = browser.post(
        reverse("documents:library"), {"files": [SimpleUploadedFile("order-terms.txt", text, "text/plain")]}
    )
    assert response.status_code == 302
    document = Document.objects.get(filename="order-terms.txt")
    assert document.state == Document.State.UPLOADED and document.dispatched_at is None
    # As if that happened a while ago: the live ingest worker's watchdog sends it at its next sweep.
    Document.objects.filter(pk=document.pk).update(
        updated_at=timezone.now() - timedelta(seconds=services.DISPATCH_GRACE_S + 5)
    )
    ready = wait_until(
        lambda: (d := Document.objects.get(pk=document.pk)).state == Document.State.READY and d,
        timeout_s=services.DISPATCH_GRACE_S + 120,
        message="the unsent upload read by the watchdog's send",
    )
    assert ready.dispatched_at is not None
    assert Chunk.objects.filter(document=ready).exists()
    assert [p.document_id for p in search_passages(user=alice, query="warehouse in Leith", limit=3)] == [ready.pk]
