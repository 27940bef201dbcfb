"""Limits per person, so that one person cannot starve or flood everyone: stored bytes, documents
waiting to be read, streams open at once, API calls a session signs, and attachments one upload
may unfold into. Against the real Postgres and broker; each limit answered with a status and a
message that name it."""

from __future__ import annotations

import asyncio

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from documents import services as document_services
from documents.models import Document
from inference import streaming
from inference.models import Job, JobKind, Queue
from tests.api.test_rest_api import bearer, problem
from tests.pdfs import make_eml

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_counts():
    """The broker outlives the test database, whose user ids start again each run: no count of
    an earlier run (or test) may be taken for this one's."""
    from django.conf import settings

    from appliance.embedded import embedded_services

    _, valkey = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    client = valkey.client(socket_timeout=10)

    def clear():
        for pattern in ("appliance:streams:*", "appliance:ratelimit:session:*"):
            for key in client.scan_iter(pattern):
                client.delete(key)

    clear()
    yield
    clear()


def _upload(client: Client, auth: dict, name: str, data: bytes):
    return client.post("/api/v1/documents", {"file": SimpleUploadedFile(name, data, content_type="text/plain")}, **auth)


def test_one_persons_storage_is_capped_with_413_naming_the_limit(alice, django_user_model, settings):
    settings.APPLIANCE_MAX_STORAGE_MB_PER_USER = 1
    client = Client()
    auth = bearer(alice)
    assert _upload(client, auth, "first.txt", b"a" * 600_000).status_code == 201
    body = problem(_upload(client, auth, "second.txt", b"b" * 600_000), 413)
    assert body["type"] == "/api/problems/storage-quota" and "APPLIANCE_MAX_STORAGE_MB_PER_USER" in body["detail"]
    assert Document.objects.filter(owner=alice).count() == 1  # nothing of the refused file stored
    carol = django_user_model.objects.create_user(username="carol", password="a long password indeed")
    assert _upload(client, bearer(carol), "second.txt", b"b" * 600_000).status_code == 201  # her own quota
    # The browser says the same, and keeps nothing.
    browser = Client()
    browser.force_login(alice)
    page = browser.post(
        "/documents/", {"files": [SimpleUploadedFile("third.txt", b"c" * 600_000)]}, follow=True
    ).content.decode()
    assert "APPLIANCE_MAX_STORAGE_MB_PER_USER" in page
    assert not Document.objects.filter(owner=alice, filename="third.txt").exists()


def test_documents_waiting_to_be_read_are_capped_per_person_with_429(alice, settings):
    settings.APPLIANCE_MAX_INGESTING_PER_USER = 2
    client = Client()
    auth = bearer(alice)
    assert _upload(client, auth, "one.txt", b"one").status_code == 201
    assert _upload(client, auth, "two.txt", b"two").status_code == 201  # both wait: no worker in this test
    response = _upload(client, auth, "three.txt", b"three")
    body = problem(response, 429)
    assert body["type"] == "/api/problems/ingest-queue-full" and "APPLIANCE_MAX_INGESTING_PER_USER" in body["detail"]
    assert int(response["Retry-After"]) >= 30
    Document.objects.filter(owner=alice, filename="one.txt").update(state=Document.State.READY)
    assert _upload(client, auth, "three.txt", b"three").status_code == 201  # room again
    # A cancelled document uploaded again waits again: it counts, and the cap holds for it too
    # (else cancelling a batch and sending it again would queue any number).
    Document.objects.filter(owner=alice, filename="two.txt").update(state=Document.State.CANCELLED)
    assert _upload(client, auth, "four.txt", b"four").status_code == 201
    assert problem(_upload(client, auth, "two.txt", b"two"), 429)["type"] == "/api/problems/ingest-queue-full"
    assert Document.objects.get(owner=alice, filename="two.txt").state == Document.State.CANCELLED
    Document.objects.filter(owner=alice, filename="four.txt").update(state=Document.State.READY)
    assert _upload(client, auth, "two.txt", b"two").status_code == 201
    assert Document.objects.get(owner=alice, filename="two.txt").state == Document.State.UPLOADED


def test_api_calls_a_session_signs_are_rate_limited_per_person(alice, settings):
    import time

    settings.APPLIANCE_SESSION_API_RATE_LIMIT_PER_MINUTE = 3
    if time.time() % 60 > 50:  # the count's window is a clock minute: start inside one
        time.sleep(61 - time.time() % 60)
    browser = Client()
    browser.force_login(alice)
    statuses = [browser.get("/api/v1/documents").status_code for _ in range(2)]
    # The search page (it embeds the query and scans the index) counts with the API calls.
    statuses.append(browser.get(reverse("documents:search"), {"q": "notice period"}).status_code)
    assert statuses == [200, 200, 200]
    page = browser.get(reverse("documents:search"), {"q": "notice period"})
    assert page.status_code == 429 and "3 times a minute" in page.content.decode()
    assert 1 <= int(page["Retry-After"]) <= 60
    assert (
        browser.get(reverse("documents:search")).status_code == 200
    )  # the empty form costs nothing and is not counted
    response = browser.get("/api/v1/documents")
    body = problem(response, 429)
    assert body["type"] == "/api/problems/rate-limited" and "session" in body["detail"]
    assert 1 <= int(response["Retry-After"]) <= 60


def test_a_persons_message_files_are_read_one_at_a_time(alice, django_user_model):
    """A message file to reply to is read in the web request (a sandbox of its own, up to its
    time and memory limits): a second of the same person's while one is read is refused with
    429 and what they typed kept; another person's is read."""
    browser = Client()
    browser.force_login(alice)
    letter = b"Dear landlord, how much notice must I give?"
    with document_services._one_reading_at_a_time(alice.pk, "first.txt"):  # alice's first, still being read
        page = browser.post(reverse("inference:draft_new"), {"message": "", "message_file": SimpleUploadedFile("second.txt", letter),
                                        "tone": "friendly"})  # fmt: skip
        assert page.status_code == 429 and 30 <= int(page["Retry-After"]) <= 60  # the turn's time left
        assert "another message file of yours is being read" in page.content.decode()
        assert 'value="friendly" selected' in page.content.decode()
        bob = django_user_model.objects.create_user("bob-reader", password="x" * 20)
        assert (
            document_services.text_of_message_upload(SimpleUploadedFile("b.txt", letter), owner_id=bob.pk)
            == letter.decode()
        )
    # Her turn is given back when the reading ends, also when it fails.
    with pytest.raises(document_services.UploadRejected, match="(?i)no text"):
        document_services.text_of_message_upload(SimpleUploadedFile("empty.txt", b"  "), owner_id=alice.pk)
    assert (
        document_services.text_of_message_upload(SimpleUploadedFile("c.txt", letter), owner_id=alice.pk)
        == letter.decode()
    )


def test_streams_open_at_once_are_capped_per_person(alice, django_user_model, settings):
    settings.APPLIANCE_MAX_STREAMS_PER_USER = 2
    job = Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE)

    async def hold_two():
        return [await streaming.take_stream_slot(alice.pk) for _ in range(2)]

    slots = asyncio.run(hold_two())
    assert all(slots)
    with pytest.raises(streaming.TooManyStreams):
        asyncio.run(streaming.take_stream_slot(alice.pk))
    # Through the API, the browser's job page and a streamed chat completion: 429, nothing queued.
    body = problem(Client().get(f"/api/v1/jobs/{job.pk}/stream", **bearer(alice, "read")), 429)
    assert body["type"] == "/api/problems/too-many-streams" and "APPLIANCE_MAX_STREAMS_PER_USER" in body["detail"]
    browser = Client()
    browser.force_login(alice)
    assert browser.get(f"/jobs/{job.pk}/events").status_code == 429
    chat = {"model": "SmolLM2-135M-Instruct", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    before = Job.objects.count()
    response = Client().post("/v1/chat/completions", chat, content_type="application/json", **bearer(alice))
    assert response.status_code == 429 and Job.objects.count() == before
    # Another person is not held back by alice's streams.
    assert asyncio.run(streaming.take_stream_slot(django_user_model.objects.create_user("dan", password="x" * 20).pk))

    # A stream that ends gives its slot back.
    async def one_stream_ends():
        async def events():
            yield "data: one\n\n"

        return [chunk async for chunk in streaming.held_stream(alice.pk, slots[0], events())]

    assert asyncio.run(one_stream_ends()) == ["data: one\n\n"]
    assert asyncio.run(streaming.take_stream_slot(alice.pk))


def test_stream_slots_of_one_event_loop_share_their_broker_connection(alice, settings):
    """The web server's event loop keeps one broker client for the slots: taking, renewing and
    giving back a slot for every stream does not connect to the broker anew each time."""
    settings.APPLIANCE_MAX_STREAMS_PER_USER = 50
    broker = streaming.sync_client()

    async def twenty_streams():
        async def events():
            yield "data: one\n\n"

        for _ in range(20):
            slot = await streaming.take_stream_slot(alice.pk)
            assert slot is not None
            assert [chunk async for chunk in streaming.held_stream(alice.pk, slot, events())] == ["data: one\n\n"]

    asyncio.run(twenty_streams())  # its first use connects
    before = int(broker.info("stats")["total_connections_received"])
    asyncio.run(twenty_streams())  # a new loop: a client of its own, then kept
    assert int(broker.info("stats")["total_connections_received"]) - before <= 2
    assert broker.zcard(streaming.streams_key(alice.pk)) == 0  # every slot was given back


def test_attachments_one_upload_unfolds_into_are_limited_in_depth_and_number(alice, settings):
    settings.APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD = 4
    settings.APPLIANCE_MAX_ATTACHMENT_DEPTH = 2

    def document(parent=None, name="mail.eml"):
        return Document.objects.create(
            owner=alice, parent=parent, title=name, filename=name, size_bytes=1, sha256=name.ljust(64, "0")[:64]
        )

    top = document()
    assert document_services._attachments_allowed(top, 3) == (3, "")
    for i in range(3):
        document(top, f"a{i}.txt")
    kept, why = document_services._attachments_allowed(top, 0)
    assert kept == 0 and why == ""
    inner = document(top, "inner.eml")  # the 4th of the upload's 4
    kept, why = document_services._attachments_allowed(inner, 3)
    assert kept == 0 and "at most 4 attachments" in why and "APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD" in why
    deeper = document(inner, "deeper.eml")  # level 2: its own attachments would be level 3
    kept, why = document_services._attachments_allowed(deeper, 1)
    assert kept == 0 and "APPLIANCE_MAX_ATTACHMENT_DEPTH" in why


@pytest.mark.django_db(transaction=True)
def test_an_email_with_more_attachments_than_allowed_keeps_the_first_and_says_so(alice, settings, queued):
    settings.APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD = 2
    mail = make_eml(
        plain="Three notes attached.",
        attachments=[(f"note{i}.txt", f"Note number {i} about the lease.".encode(), "text/plain") for i in range(3)],
    )
    upload = SimpleUploadedFile("notes.eml", mail, content_type="message/rfc822")
    document, _ = document_services.document_create(owner=alice, upload=upload, ingest_here=True)
    document.refresh_from_db()
    assert document.state == Document.State.READY
    assert sorted(document.children.values_list("filename", flat=True)) == ["note0.txt", "note1.txt"]
    assert sorted(queued) == sorted(document.children.values_list("pk", flat=True))
    assert "1 of its 3 attachment(s) were not kept" in document.failure_reason
    browser = Client()
    browser.force_login(alice)
    assert "APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD" in browser.get(f"/documents/{document.pk}/").content.decode()
