"""``/api/v1/batches`` and ``POST /api/v1/documents/{id}/cancel`` through Django's test client,
against the real Postgres and broker: creating a batch from files and from a zip, listing,
reading and cancelling it, following it as server-sent events, and who may do what.

Files stored here are queued only once their transaction commits, which a test's never does
(but for the stream's, which is transactional and queues nothing): no worker reads them here; ``test_batches.py`` runs the real ingest worker."""

from __future__ import annotations

import asyncio
import io
import zipfile
from pathlib import Path
from typing import get_args

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from api.services import token_create
from documents import batch_services
from documents.batch_api import BatchState, batch_events
from documents.models import Batch, Document

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
CUAD = ROOT.parent / "shared" / "data" / "cuad-dev" / "pdf"
LICENCES = Path("/usr/share/common-licenses")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user(username="bob", password="another long password")


def bearer(user, *scopes) -> dict:
    _, raw = token_create(user=user, name="a tool", scopes=list(scopes or ["read", "write"]))
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def licence(name: str) -> SimpleUploadedFile:
    return SimpleUploadedFile(f"{name}.txt", (LICENCES / name).read_bytes(), content_type="text/plain")


def contract(number: int) -> SimpleUploadedFile:
    name = f"dev-{number:02d}.pdf"
    return SimpleUploadedFile(name, (CUAD / name).read_bytes(), content_type="application/pdf")


def folder_zip() -> SimpleUploadedFile:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("contracts/dev-23.pdf", (CUAD / "dev-23.pdf").read_bytes())
        archive.writestr("contracts/licences/MPL-2.0.txt", (LICENCES / "MPL-2.0").read_bytes())
        archive.writestr("contracts/../../escape.txt", b"out of the folder")
        archive.writestr("contracts/old.zip", b"PK\x05\x06" + b"\0" * 18)
        archive.writestr("contracts/scan.tiff", b"II*\0 not a document type")
    return SimpleUploadedFile("contracts.zip", buffer.getvalue(), content_type="application/zip")


def test_a_batch_from_files_lists_each_file_with_its_state_and_progress(alice):
    client = Client()
    auth = bearer(alice)
    response = client.post(
        "/api/v1/batches", {"files": [licence("GPL-3"), contract(12), licence("Apache-2.0")]}, **auth
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "3 files" and body["state"] == "running"
    assert [f["filename"] for f in body["files"]] == ["GPL-3.txt", "dev-12.pdf", "Apache-2.0.txt"]
    assert {f["state"] for f in body["files"]} == {"uploaded"} and body["skipped"] == []
    progress = body["progress"]
    assert progress["files_total"] == 3 and progress["files_waiting"] == 3 and progress["files_done"] == 0
    assert progress["pages_per_s"] is None and progress["eta_s"] is None and not progress["finished"]
    batch = Batch.objects.get(pk=body["id"])
    assert batch.owner == alice and Document.objects.filter(batch=batch, owner=alice).count() == 3

    listed = client.get("/api/v1/batches", **auth).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == batch.pk
    detail = client.get(f"/api/v1/batches/{batch.pk}", **auth).json()
    assert [f["id"] for f in detail["files"]] == [f["id"] for f in body["files"]]

    # The same files again: already in the library, listed as skipped with where they are.
    again = client.post("/api/v1/batches", {"files": [licence("GPL-3")]}, **auth).json()
    assert again["files"] == [] and again["state"] == "finished" and again["progress"]["finished"]
    assert "Already in your library" in again["skipped"][0]["reason"]
    assert again["skipped"][0]["document_id"] == body["files"][0]["id"]


def test_a_batch_from_a_zip_takes_its_documents_and_says_why_it_skipped_the_rest(alice):
    client = Client()
    response = client.post("/api/v1/batches", {"files": [folder_zip()]}, **bearer(alice))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "contracts.zip"
    assert sorted(f["filename"] for f in body["files"]) == ["MPL-2.0.txt", "dev-23.pdf"]
    skipped = {entry["name"]: entry["reason"] for entry in body["skipped"]}
    assert "climbs out of the folder" in skipped["contracts/../../escape.txt"]
    assert "nested archives are not opened" in skipped["contracts/old.zip"]
    assert "not a document type" in skipped["contracts/scan.tiff"]
    assert body["progress"]["files_total"] == 5 and body["progress"]["files_skipped"] == 3
    assert not Document.objects.filter(filename__in=["escape.txt", "old.zip", "scan.tiff"]).exists()


def test_a_batch_is_shared_with_the_groups_chosen_and_only_yours(alice):
    from django.contrib.auth.models import Group

    legal, board = Group.objects.create(name="Legal"), Group.objects.create(name="Board")
    alice.groups.add(legal)
    client = Client()
    auth = bearer(alice)
    refused = client.post("/api/v1/batches", {"files": [licence("LGPL-2")], "groups": [board.pk]}, **auth)
    assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == "groups"
    assert not Batch.objects.exists() and not Document.objects.exists()
    body = client.post("/api/v1/batches", {"files": [folder_zip()], "groups": [legal.pk]}, **auth).json()
    for document in Document.objects.filter(batch_id=body["id"]):
        assert list(document.shared_with.all()) == [legal]


def test_a_file_over_the_upload_limit_is_skipped_with_the_limit(alice, settings):
    settings.APPLIANCE_MAX_UPLOAD_MB = 1
    big = SimpleUploadedFile("big.txt", b"words " * 200_000)  # 1.2 MB
    body = Client().post("/api/v1/batches", {"files": [big, licence("BSD")]}, **bearer(alice)).json()
    assert [f["filename"] for f in body["files"]] == ["BSD.txt"]
    assert body["skipped"][0]["name"] == "big.txt" and "the limit is 1 MB" in body["skipped"][0]["reason"]


def test_cancel_stops_what_has_not_started_and_leaves_what_is_done(alice):
    client = Client()
    auth = bearer(alice)
    batch, created = batch_services.batch_create(
        owner=alice, uploads=[licence("GPL-2"), licence("LGPL-2.1"), licence("Artistic")]
    )
    done, reading, waiting = created
    Document.objects.filter(pk=done.pk).update(state=Document.State.READY, pages_total=2, pages_done=2)
    Document.objects.filter(pk=reading.pk).update(state=Document.State.EMBEDDING, pages_total=4, pages_done=1)
    response = client.post(f"/api/v1/batches/{batch.pk}/cancel", **auth)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "cancelled"
    states = {f["id"]: f["state"] for f in body["files"]}
    assert states == {done.pk: "ready", reading.pk: "embedding", waiting.pk: "cancelled"}
    reading.refresh_from_db()
    assert reading.cancel_requested  # the worker stops it at its next check (test_batches.py)
    assert body["progress"]["files_done"] == 1 and body["progress"]["files_cancelled"] == 1
    assert body["progress"]["eta_s"] is None and not body["progress"]["finished"]  # one file is stopping
    assert client.post(f"/api/v1/batches/{batch.pk}/cancel", **auth).status_code == 409


def test_a_document_being_read_can_be_cancelled_by_its_owner_only(alice, bob):
    document, _ = batch_services.document_create(owner=alice, upload=licence("GPL-1"))
    client = Client()
    assert client.post(f"/api/v1/documents/{document.pk}/cancel", **bearer(bob)).status_code == 404
    response = client.post(f"/api/v1/documents/{document.pk}/cancel", **bearer(alice))
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert client.post(f"/api/v1/documents/{document.pk}/cancel", **bearer(alice)).status_code == 409
    # The same file uploaded again is read again.
    again, created = batch_services.document_create(owner=alice, upload=licence("GPL-1"))
    assert created and again.pk == document.pk and again.state == Document.State.UPLOADED


def test_another_user_can_neither_see_nor_cancel_your_batch(alice, bob):
    batch, _ = batch_services.batch_create(owner=alice, uploads=[licence("LGPL-3"), licence("GFDL-1.3")])
    client = Client()
    theirs = bearer(bob)
    for response in (
        client.get(f"/api/v1/batches/{batch.pk}", **theirs),
        client.post(f"/api/v1/batches/{batch.pk}/cancel", **theirs),
        client.get(f"/api/v1/batches/{batch.pk}/stream", **theirs),
    ):
        assert response.status_code == 404 and response["Content-Type"] == "application/problem+json"
        assert "LGPL" not in response.content.decode()
    assert client.get("/api/v1/batches", **theirs).json()["count"] == 0
    batch.refresh_from_db()
    assert batch.state == Batch.State.RUNNING
    assert not Document.objects.filter(batch=batch, state=Document.State.CANCELLED).exists()
    # A read-only token of the owner reads it but may not create or cancel.
    read_only = bearer(alice, "read")
    assert client.get(f"/api/v1/batches/{batch.pk}", **read_only).status_code == 200
    assert client.post(f"/api/v1/batches/{batch.pk}/cancel", **read_only).status_code == 403
    assert client.post("/api/v1/batches", {"files": [licence("CC0-1.0")]}, **read_only).status_code == 403


def test_the_batch_endpoints_are_documented_in_the_schema():
    schema = Client().get("/api/schema").json()
    paths = schema["paths"]
    assert {"post", "get"} <= set(paths["/api/v1/batches"])
    assert "get" in paths["/api/v1/batches/{batch_id}"]
    assert "post" in paths["/api/v1/batches/{batch_id}/cancel"]
    assert "post" in paths["/api/v1/documents/{document_id}/cancel"]
    stream = paths["/api/v1/batches/{batch_id}/stream"]["get"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    assert get_args(BatchState) == tuple(Batch.State.values)


async def _events(batch_id: int, *, until: str, on_first_progress=None) -> list[str]:
    seen = []
    async for chunk in batch_events(batch_id, every_s=0.05):
        seen.append(chunk)
        if chunk.startswith("event: progress") and on_first_progress is not None:
            await on_first_progress()
            on_first_progress = None
        if chunk.startswith(f"event: {until}"):
            break
    await _close_connections()
    return seen


async def _close_connections() -> None:
    """The stream's queries ran on a thread of this event loop's: close its connection, so that
    the test database can be dropped at the end."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(connections.close_all)()


@pytest.mark.django_db(transaction=True)
def test_the_stream_reports_progress_then_the_end(alice, queued):
    from asgiref.sync import sync_to_async

    batch, created = batch_services.batch_create(owner=alice, uploads=[licence("MPL-1.1")])
    assert queued == [created[0].pk]

    async def cancel() -> None:
        await sync_to_async(batch_services.batch_cancel)(batch=batch, user=alice)

    events = asyncio.run(_events(batch.pk, until="cancelled", on_first_progress=cancel))
    assert events[0].startswith("retry:")
    assert events[1].startswith("event: progress") and '"files_waiting": 1' in events[1]
    assert events[-1].startswith("event: cancelled") and '"files_cancelled": 1' in events[-1]
    response = Client().get(f"/api/v1/batches/{batch.pk}/stream", **bearer(alice))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")

    async def body() -> str:
        text = "".join([part.decode() async for part in response.streaming_content])
        await _close_connections()
        return text

    assert "event: cancelled" in asyncio.run(body())


def test_an_administrator_sees_batches_and_can_cancel_one(alice, django_user_model):
    from django.urls import reverse

    batch, created = batch_services.batch_create(owner=alice, uploads=[licence("GFDL-1.2")])
    admin = django_user_model.objects.create_superuser(username="root", password="x" * 20)
    client = Client()
    client.force_login(admin)
    listing = client.get(reverse("admin:documents_batch_changelist"))
    assert listing.status_code == 200 and "GFDL-1.2.txt" in listing.content.decode()
    response = client.post(
        reverse("admin:documents_batch_changelist"), {"action": "cancel", "_selected_action": [batch.pk]}
    )
    assert response.status_code == 302
    batch.refresh_from_db()
    assert batch.state == Batch.State.CANCELLED
    assert Document.objects.get(pk=created[0].pk).state == Document.State.CANCELLED


def test_files_past_the_per_person_ingest_cap_are_skipped_with_that_reason(alice, settings):
    settings.APPLIANCE_MAX_INGESTING_PER_USER = 2
    body = (
        Client()
        .post("/api/v1/batches", {"files": [licence("GPL-2"), licence("GPL-3"), licence("LGPL-3")]}, **bearer(alice))
        .json()
    )
    assert [f["filename"] for f in body["files"]] == ["GPL-2.txt", "GPL-3.txt"]
    assert body["skipped"][0]["name"] == "LGPL-3.txt"
    assert "APPLIANCE_MAX_INGESTING_PER_USER" in body["skipped"][0]["reason"]


def test_the_batch_status_measures_the_rate_and_estimates_unopened_files_by_their_bytes(alice):
    from datetime import timedelta

    from django.utils import timezone

    from documents import selectors

    batch, (done, reading, waiting, other) = batch_services.batch_create(
        owner=alice, uploads=[contract(0), contract(1), contract(4), contract(8)]
    )
    Document.objects.filter(pk=done.pk).update(state="ready", size_bytes=100_000, pages_total=10, pages_done=10)
    Document.objects.filter(pk=reading.pk).update(state="embedding", size_bytes=300_000, pages_total=4, pages_done=1)
    Document.objects.filter(pk=waiting.pk).update(size_bytes=100_000)
    Document.objects.filter(pk=other.pk).update(state="failed", pages_total=None)
    now = timezone.now()
    Batch.objects.filter(pk=batch.pk).update(created_at=now - timedelta(seconds=10))
    batch.refresh_from_db()
    status = selectors.batch_status(batch, now=now)
    # 11 pages in 10 s; left: 3 pages known, and 100 KB at the 14 pages per 400 KB of the opened PDFs.
    assert status.pages_per_s == 1.1 and status.eta_s == round((3 + 3.5) / 1.1) == 6
    assert (status.files_done, status.files_reading, status.files_waiting, status.files_failed) == (1, 1, 1, 1)
    assert status.eta_words == "about 6 s"
