"""Batches and cancelling through the real ingest worker: files uploaded together in the library
(or a zip of a folder) are read as one batch followed on its page; a hostile member fails alone
with its reason; Cancel stops what has not started and leaves what is done; a document cancelled
while it is read leaves no passage searchable, and the worker goes on.

Real files: licence texts from ``/usr/share/common-licenses`` and contracts from CUAD-dev
(``../shared/data/cuad-dev`` beside the repository)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from documents import batch_progress, selectors
from documents.models import Batch, Chunk, Document, Page
from documents.search import search_passages
from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CUAD = ROOT.parent / "shared" / "data" / "cuad-dev" / "pdf"
LICENCES = Path("/usr/share/common-licenses")


def licence(name: str) -> SimpleUploadedFile:
    return SimpleUploadedFile(f"{name}.txt", (LICENCES / name).read_bytes(), content_type="text/plain")


def contract(number: int) -> SimpleUploadedFile:
    name = f"dev-{number:02d}.pdf"
    return SimpleUploadedFile(name, (CUAD / name).read_bytes(), content_type="application/pdf")


def upload_batch(browser, files: list) -> Batch:
    response = browser.post(reverse("documents:library"), {"files": files})
    assert response.status_code == 302, response.content
    batch = Batch.objects.order_by("-pk").first()
    assert batch is not None and response["Location"] == reverse("documents:batch", args=[batch.pk])
    return batch


def settled(batch: Batch, timeout_s: float = 300) -> Batch:
    def done():
        batch.refresh_from_db()
        return batch if batch.finished_at is not None else None

    return wait_until(done, timeout_s=timeout_s, message=f"batch {batch.pk} to finish")


def test_files_uploaded_together_are_one_batch_read_and_followed_on_its_page(browser, alice, workers):
    batch = upload_batch(browser, [licence("Apache-2.0"), contract(23), contract(12)])
    page = browser.get(reverse("documents:batch", args=[batch.pk])).content.decode()
    assert "Cancel the batch" in page and "hx-trigger" in page  # followed live while it runs
    batch = settled(batch)
    assert batch.state == Batch.State.FINISHED and batch.owner == alice and batch.files_total == 3
    documents = list(selectors.batch_documents(batch))
    assert [d.filename for d in documents] == ["Apache-2.0.txt", "dev-23.pdf", "dev-12.pdf"]
    for document in documents:
        assert document.state == Document.State.READY, (document.filename, document.failure_reason)
        assert Chunk.objects.filter(document=document).exists()
    status = selectors.batch_status(batch)
    assert status.files_done == 3 and status.finished and status.eta_s is None and status.eta_words == "done"
    assert status.pages_done == sum(d.pages_total or 0 for d in documents) >= 4
    # A rate once the batch has run long enough to give one (a fast machine read these 8 pages in
    # 0.9 s, under the second below which a rate is noise: none is shown then).
    if status.elapsed_s >= batch_progress.MIN_ELAPSED_S:
        assert status.pages_per_s is not None and status.pages_per_s > 0
    else:
        assert status.pages_per_s is None
    page = browser.get(reverse("documents:batch", args=[batch.pk])).content.decode()
    assert "3 done, 0 failed" in page and "Cancel the batch" not in page and "hx-trigger" not in page
    assert "Pages per second" in page


def test_a_zip_is_one_batch_whose_hostile_members_fail_or_are_skipped_alone_with_their_reason(browser, alice, workers):
    pdf = (CUAD / "dev-28.pdf").read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("folder/BSD.txt", (LICENCES / "BSD").read_bytes())
        archive.writestr("folder/contracts/dev-28.pdf", pdf)
        archive.writestr("folder/contracts/broken.pdf", pdf[:4000])  # a PDF cut short
        archive.writestr("folder/not-a-pdf.pdf", b"MZ\x90\x00 a program, named as a PDF")
        archive.writestr("../outside.txt", b"climbs out")
        archive.writestr("folder/more.zip", b"PK\x05\x06" + b"\0" * 18)
        archive.writestr("folder/logo.png", b"\x89PNG\r\n\x1a\n")
    batch = upload_batch(browser, [SimpleUploadedFile("folder.zip", buffer.getvalue(), "application/zip")])
    batch = settled(batch)
    states = {d.filename: d for d in selectors.batch_documents(batch)}
    assert set(states) == {"BSD.txt", "dev-28.pdf", "broken.pdf", "not-a-pdf.pdf"}
    assert states["BSD.txt"].state == states["dev-28.pdf"].state == Document.State.READY
    for name in ("broken.pdf", "not-a-pdf.pdf"):
        failed = states[name]
        assert failed.state == Document.State.FAILED and failed.failure_reason
        assert "internal error" not in failed.failure_reason  # a reason about the file, not the worker
        assert not Chunk.objects.filter(document=failed).exists()
    skipped = {entry["name"]: entry["reason"] for entry in batch.skipped}
    assert set(skipped) == {"../outside.txt", "folder/more.zip", "folder/logo.png"}
    page = browser.get(reverse("documents:batch", args=[batch.pk])).content.decode()
    assert "2 done, 2 failed" in page and "3 skipped" in page
    assert states["broken.pdf"].failure_reason in page.replace("&#x27;", "'").replace("&quot;", '"')
    assert "nested archives are not opened" in page


def test_cancel_stops_what_has_not_started_and_leaves_what_is_done(browser, alice, workers):
    batch = upload_batch(browser, [licence("CC0-1.0"), contract(2), contract(3), contract(17), contract(9)])
    first = selectors.batch_documents(batch).first()
    wait_until(
        lambda: Document.objects.get(pk=first.pk).state == Document.State.READY, timeout_s=180, message="the first"
    )
    response = browser.post(reverse("documents:batch_cancel", args=[batch.pk]), follow=True)
    assert "Batch cancelled" in response.content.decode()
    batch = settled(batch, timeout_s=180)
    assert batch.state == Batch.State.CANCELLED
    documents = list(selectors.batch_documents(batch))
    assert documents[0].state == Document.State.READY and Chunk.objects.filter(document=documents[0]).exists()
    rest = documents[1:]
    assert {d.state for d in rest} <= {Document.State.READY, Document.State.CANCELLED}
    cancelled = [d for d in rest if d.state == Document.State.CANCELLED]
    assert len(cancelled) >= 3  # the one being read may have finished first; the queued ones never start
    for document in cancelled:
        assert not Chunk.objects.filter(document=document).exists()
        assert not Page.objects.filter(document=document).exists()
    # The worker is not broken: the next upload is read.
    response = browser.post(reverse("documents:library"), {"files": [licence("MPL-1.1")]})
    assert response.status_code == 302
    after = Document.objects.get(filename="MPL-1.1.txt")
    wait_until(lambda: Document.objects.get(pk=after.pk).is_finished, timeout_s=180, message="the next upload")
    assert Document.objects.get(pk=after.pk).state == Document.State.READY


def test_a_document_cancelled_while_it_is_read_leaves_nothing_searchable(browser, alice, workers):
    text = b"\n\n".join(
        (LICENCES / name).read_bytes() for name in sorted(p.name for p in LICENCES.iterdir() if p.is_file())
    )
    long = SimpleUploadedFile("all-the-licences.txt", text * 2, content_type="text/plain")
    assert browser.post(reverse("documents:library"), {"files": [long]}).status_code == 302
    document = Document.objects.get(filename="all-the-licences.txt")
    wait_until(
        lambda: Document.objects.get(pk=document.pk).state == Document.State.EMBEDDING,
        timeout_s=180,
        message="embedding to start",
    )
    page = browser.get(reverse("documents:detail", args=[document.pk])).content.decode()
    assert "Cancel reading this document" in page
    browser.post(reverse("documents:cancel", args=[document.pk]))
    wait_until(lambda: Document.objects.get(pk=document.pk).is_finished, timeout_s=180, message="the cancel")
    document.refresh_from_db()
    assert document.state == Document.State.CANCELLED and not document.cancel_requested
    assert not Chunk.objects.filter(document=document).exists() and not Page.objects.filter(document=document).exists()
    assert all(hit.document_id != document.pk for hit in search_passages(user=alice, query="Mozilla Public License"))
    # The worker goes on with the next file.
    assert browser.post(reverse("documents:library"), {"files": [licence("Artistic")]}).status_code == 302
    after = Document.objects.get(filename="Artistic.txt")
    wait_until(lambda: Document.objects.get(pk=after.pk).is_finished, timeout_s=180, message="the next upload")
    assert Document.objects.get(pk=after.pk).state == Document.State.READY


def test_a_worker_that_reads_the_first_files_before_the_rest_are_added_leaves_the_batch_running(alice):
    """The ingest worker reads files side by side, so it can finish a batch's first file while the
    upload is still saving the next one: the batch is not finished until it is filled."""
    from documents.services import batch_settle

    batch = Batch.objects.create(owner=alice, name="2 files")  # being filled: files_total not counted yet
    Document.objects.create(
        owner=alice, batch=batch, title="first", filename="first.txt", size_bytes=1, sha256="1" * 64,
        state=Document.State.READY,
    )  # fmt: skip
    batch_settle(batch_id=batch.pk)  # what the worker does when the first file is ready
    batch.refresh_from_db()
    assert batch.state == Batch.State.RUNNING and batch.finished_at is None
    second = Document.objects.create(
        owner=alice, batch=batch, title="second", filename="second.txt", size_bytes=1, sha256="2" * 64
    )
    Batch.objects.filter(pk=batch.pk).update(files_total=2)
    batch_settle(batch_id=batch.pk, filled=True)  # the upload is done; the second file is not read yet
    batch.refresh_from_db()
    assert batch.finished_at is None
    Document.objects.filter(pk=second.pk).update(state=Document.State.READY)
    batch_settle(batch_id=batch.pk)  # the worker, after the last file
    batch.refresh_from_db()
    assert batch.state == Batch.State.FINISHED and batch.finished_at is not None


def test_a_batch_whose_upload_died_while_filling_it_settles_after_the_fill_timeout(alice):
    from datetime import timedelta

    from django.utils import timezone

    from documents.services import BATCH_FILL_TIMEOUT_S, batch_settle

    batch = Batch.objects.create(owner=alice, name="3 files")  # the web process died after the first
    Document.objects.create(
        owner=alice, batch=batch, title="first", filename="first.txt", size_bytes=1, sha256="1" * 64,
        state=Document.State.READY,
    )  # fmt: skip
    batch_settle(batch_id=batch.pk)
    assert Batch.objects.get(pk=batch.pk).finished_at is None
    Batch.objects.filter(pk=batch.pk).update(created_at=timezone.now() - timedelta(seconds=BATCH_FILL_TIMEOUT_S + 1))
    batch_settle(batch_id=batch.pk)
    assert Batch.objects.get(pk=batch.pk).state == Batch.State.FINISHED


def test_names_the_disk_would_refuse_and_a_damaged_member_fail_or_pass_alone(browser, alice, workers):
    """A name is kept as given and the file stored under a name of the appliance's own: 100
    Chinese characters are 300 bytes, past the file system's 255, and a name with no letter or
    digit ("€.txt") Django refused, each a 500 that left the batch half made. A member whose
    compressed stream is damaged (LZMA, whose error the zip reader does not wrap) is skipped
    with its reason, the others taken."""
    long_name = "合同" * 50 + ".txt"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_LZMA) as archive:
        archive.writestr("damaged.txt", (LICENCES / "GPL-3").read_bytes())
        archive.writestr(f"folder/{long_name}", (LICENCES / "MPL-2.0").read_bytes())
        archive.writestr("folder/€.txt", (LICENCES / "CC0-1.0").read_bytes())
    raw = bytearray(buffer.getvalue())
    start = 30 + len("damaged.txt") + 4  # the first member's LZMA properties, made nonsense
    raw[start : start + 5] = b"\xff" * 5
    alone = SimpleUploadedFile("ü" * 200 + ".txt", (LICENCES / "BSD").read_bytes(), "text/plain")
    batch = settled(upload_batch(browser, [SimpleUploadedFile("folder.zip", bytes(raw), "application/zip"), alone]))
    documents = {d.filename: d for d in selectors.batch_documents(batch)}
    assert set(documents) == {long_name, "€.txt", "ü" * 200 + ".txt"}
    for document in documents.values():
        assert document.state == Document.State.READY, (document.filename, document.failure_reason)
        stored = Path(document.file.name).name
        assert len(stored) == len("0123456789abcdef0123456789abcdef.txt") and stored.endswith(".txt")
    assert batch.files_total == 4 and [entry["name"] for entry in batch.skipped] == ["damaged.txt"]
    assert "damaged" in batch.skipped[0]["reason"]
    response = browser.get(reverse("documents:download", args=[documents[long_name].pk]))
    assert response.status_code == 200 and b"".join(response.streaming_content) == (LICENCES / "MPL-2.0").read_bytes()
    assert "filename*=utf-8''" + "%E5%90%88%E5%90%8C" * 50 in response["Content-Disposition"]
