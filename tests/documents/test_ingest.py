"""Ingestion through the real ingest worker: every format to pages, chunks and embeddings;
progress and state; no duplicate work; deletion; hostile files fail alone."""

from __future__ import annotations

import contextlib
import os
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from documents.models import Chunk, Document, Page
from documents.search import search_passages
from tests.conftest import wait_until
from tests.pdfs import CONTRACT_PAGES, docx_paragraph, make_docx, make_eml, make_pdf

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def upload(browser, name: str, data: bytes, content_type: str = "application/octet-stream"):
    response = browser.post(
        reverse("documents:library"), {"files": [SimpleUploadedFile(name, data, content_type=content_type)]}
    )
    assert response.status_code == 302
    return Document.objects.filter(filename=name, parent__isnull=True).order_by("-pk").first()


def finished(document_id: int, timeout_s: float = 180) -> Document:
    def done():
        document = Document.objects.get(pk=document_id)
        return document if document.is_finished else None

    return wait_until(done, timeout_s=timeout_s, message=f"document {document_id} to finish")


def test_every_format_becomes_pages_chunks_and_embeddings(browser, alice, workers):
    files = {
        "contract.pdf": make_pdf(CONTRACT_PAGES, title="Services agreement"),
        "minutes.txt": b"Board minutes\n\nThe board approved the budget for the new warehouse in Leeds.\f"
        b"Page two: the auditors were reappointed.",
        "policy.md": b"# Travel policy\n\nStaff book rail travel in standard class for journeys under four hours.",
        "letter.docx": make_docx(
            docx_paragraph("Dear Sir,")
            + docx_paragraph("We accept the revised delivery schedule.")
            + docx_paragraph("Yours faithfully", page_break_before=True)
        ),
    }
    documents = {name: upload(browser, name, data) for name, data in files.items()}
    for name, document in documents.items():
        document = finished(document.pk)
        assert document.state == Document.State.READY, (name, document.failure_reason)
        pages = list(Page.objects.filter(document=document).order_by("number"))
        assert document.pages_total == len(pages) >= 1 and document.pages_done == document.pages_total
        full_text = "\n\n".join(page.text for page in pages)
        for page in pages:  # every page's offset points at its text in the document's text
            assert full_text[page.char_start : page.char_start + len(page.text)] == page.text
        chunks = list(Chunk.objects.filter(document=document).order_by("index"))
        assert chunks and all(chunk.embedding is not None for chunk in chunks)
        assert {chunk.embedding_model for chunk in chunks} == {document.embedding_model} != {""}
        for chunk in chunks:
            assert full_text[chunk.char_start : chunk.char_end] == chunk.text
            assert 1 <= chunk.page_start <= chunk.page_end <= len(pages)
    assert documents["contract.pdf"].kind == Document.Kind.PDF
    assert Document.objects.get(pk=documents["letter.docx"].pk).pages_total == 2  # the page break
    assert Document.objects.get(pk=documents["minutes.txt"].pk).pages_total == 2  # the form feed
    assert Document.objects.get(pk=documents["policy.md"].pk).kind == Document.Kind.MARKDOWN

    hits = search_passages(user=alice, query="how long is the notice period to end the agreement")
    assert hits and hits[0].document_id == documents["contract.pdf"].pk
    assert hits[0].page_start <= 2 <= hits[0].page_end  # clause 5 is on page 2
    hits = search_passages(user=alice, query="auditors reappointed")
    assert hits[0].document_id == documents["minutes.txt"].pk and hits[0].page_end == 2


def test_an_email_brings_its_attachments_as_child_documents(browser, alice, workers):
    attachment = make_pdf(["Schedule 1. Delivery dates for 2026: March, June, September."])
    email = upload(
        browser,
        "renewal.eml",
        make_eml(
            subject="Renewal of the services agreement",
            plain="Please find the delivery schedule attached.",
            attachments=[("schedule.pdf", attachment, "application/pdf")],
        ),
        "message/rfc822",
    )
    email = finished(email.pk)
    assert email.state == Document.State.READY and email.kind == Document.Kind.EMAIL
    assert email.title == "Renewal of the services agreement"
    assert "delivery schedule attached" in Page.objects.get(document=email, number=1).text
    child = wait_until(lambda: Document.objects.filter(parent=email).first(), timeout_s=60, message="the attachment")
    child = finished(child.pk)
    assert child.state == Document.State.READY and child.owner == alice and child.filename == "schedule.pdf"
    assert "September" in Page.objects.get(document=child, number=1).text
    page = browser.get(reverse("documents:detail", args=[email.pk]))
    assert b"schedule" in page.content


def test_same_bytes_twice_is_one_document_and_deletion_removes_everything(browser, alice, workers):
    data = make_pdf(["A one-page notice about the car park."])
    first = finished(upload(browser, "notice.pdf", data).pk)
    chunk_ids = set(Chunk.objects.filter(document=first).values_list("pk", flat=True))
    response = browser.post(
        reverse("documents:library"), {"files": [SimpleUploadedFile("notice-copy.pdf", data)]}, follow=True
    )
    assert "already in your library" in response.content.decode()
    assert Document.objects.filter(owner=alice).count() == 1
    time.sleep(2)  # had it been queued again, the worker would have replaced the chunks by now
    assert set(Chunk.objects.filter(document=first).values_list("pk", flat=True)) == chunk_ids

    stored = first.file.path
    assert Page.objects.filter(document=first).exists() and Chunk.objects.filter(document=first).exists()
    response = browser.post(reverse("documents:delete", args=[first.pk]))
    assert response.status_code == 302
    assert not Document.objects.filter(pk=first.pk).exists()
    assert not Page.objects.filter(document_id=first.pk).exists()
    assert not Chunk.objects.filter(document_id=first.pk).exists()
    assert not os.path.exists(stored)


HOSTILE = [
    ("fake.pdf", b"MZ\x90\x00 this is a Windows program, not a PDF" * 50, "not a PDF"),
    ("locked.pdf", make_pdf(["Private."], password="s3cret"), "password"),
    ("truncated.pdf", make_pdf(CONTRACT_PAGES)[:700], "damaged"),
    ("random.bin", bytes(range(256)) * 64, "not a supported format"),
]


@pytest.mark.parametrize(("name", "data", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_files_fail_alone_and_the_worker_keeps_going(browser, alice, workers, name, data, message):
    bad = finished(upload(browser, name, data).pk)
    assert bad.state == Document.State.FAILED
    assert message.lower() in bad.failure_reason.lower()
    good = finished(upload(browser, "after.txt", b"A plain file uploaded after the hostile one.").pk)
    assert good.state == Document.State.READY  # the worker survived and carried on
    assert message.encode().lower() in browser.get(reverse("documents:detail", args=[bad.pk])).content.lower()


def test_an_upload_over_the_size_limit_is_refused_with_a_message(browser, alice, settings):
    settings.APPLIANCE_MAX_UPLOAD_MB = 1
    response = browser.post(
        reverse("documents:library"), {"files": [SimpleUploadedFile("huge.txt", b"x" * (1024 * 1024 + 1))]}, follow=True
    )
    assert b"the limit is 1 MB" in response.content
    assert not Document.objects.exists()


def test_documents_read_together_each_get_their_own_passages_vectors(browser, alice, workers):
    """The worker reads several documents at once and embeds their passages together in shared
    batches: each passage's stored vector is still the one the model gives for what it embeds
    for that passage alone (its text under its section's title)."""
    import numpy as np

    from documents.chunking import document_text, embedding_text
    from documents.embeddings import get_embedder, headings_for

    subjects = ("a lease of the Leeds warehouse", "the payroll audit", "rail travel in standard class",
                "the supplier insurance", "the pension scheme trustees", "a refund of the deposit")  # fmt: skip
    files = {
        f"together-{n}.pdf": make_pdf([f"Page {page} of the note on {subject}. " * 12 for page in range(1, 4)])
        for n, subject in enumerate(subjects)
    }
    response = browser.post(
        reverse("documents:library"),
        {"files": [SimpleUploadedFile(name, data, content_type="application/pdf") for name, data in files.items()]},
    )
    assert response.status_code == 302
    documents = [Document.objects.get(filename=name, parent__isnull=True) for name in files]
    embedder = get_embedder()
    for document, subject in zip(documents, subjects, strict=True):
        document = finished(document.pk)
        assert document.state == Document.State.READY, document.failure_reason
        chunks = list(Chunk.objects.filter(document=document).order_by("index"))
        assert chunks and all(subject in " ".join(chunk.text.split()) for chunk in chunks)  # lines wrap
        stored = np.array([chunk.embedding for chunk in chunks], dtype=np.float32)
        pages = list(document.pages.order_by("number").values_list("number", "char_start", "text"))
        headings = headings_for(embedder, document_text(pages), chunks)
        alone = embedder.encode(
            [embedding_text(c.text, h) for c, h in zip(chunks, headings, strict=True)], batch_size=1
        )
        assert np.min(np.sum(stored * alone, axis=1)) > 0.999  # unit rows: cosine similarity


def test_a_passage_is_embedded_under_the_title_of_the_section_it_starts_in(browser, alice, workers):
    """A clause cut into several passages: the later ones are embedded with the clause's title
    on a line before them (their stored text is their own), the first, which holds its title,
    as it is."""
    import numpy as np

    from documents.chunking import document_text, embedding_text, passage_headings
    from documents.embeddings import get_embedder, headings_for

    clause = [
        f"The Supplier may not transfer its rights under contract number {n} to another company without the "
        "prior written consent of the Customer, which may be withheld for any reason."
        for n in range(1, 31)
    ]
    data = make_pdf(["SERVICES AGREEMENT\n11. Assignment.\n" + "\n".join(clause[:15]), "\n".join(clause[15:])])
    document = finished(upload(browser, "assignment.pdf", data, "application/pdf").pk)
    assert document.state == Document.State.READY, document.failure_reason
    chunks = list(Chunk.objects.filter(document=document).order_by("index"))
    assert len(chunks) >= 3
    pages = list(document.pages.order_by("number").values_list("number", "char_start", "text"))
    headings = passage_headings(document_text(pages), chunks)
    assert headings[0] is None and headings[1:] == ["Assignment"] * (len(chunks) - 1)
    assert headings_for(get_embedder(), document_text(pages), chunks) == headings  # they fit
    embedder = get_embedder()
    stored = np.array([chunk.embedding for chunk in chunks], dtype=np.float32)
    titled = embedder.encode([embedding_text(c.text, h) for c, h in zip(chunks, headings, strict=True)], batch_size=1)
    bare = embedder.encode([chunk.text for chunk in chunks], batch_size=1)
    assert np.min(np.sum(stored * titled, axis=1)) > 0.999  # unit rows: cosine similarity
    assert np.max(np.sum(stored[1:] * bare[1:], axis=1)) < 0.999  # not the passage's text alone
    assert all(chunk.text.lstrip().startswith("The Supplier") for chunk in chunks[1:])  # stored as it is


def _thread_classes(pid: int) -> list[int]:
    classes = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            classes.append(os.sched_getscheduler(int(task)))
    return classes


def test_the_ingest_worker_yields_the_cpu_to_the_other_processes(browser, alice, workers, settings):
    """Reading documents is background work: its worker runs APPLIANCE_INGEST_NICE below the
    drafting and document-job workers, in the CPU class its setting names (idle-embedding: the
    thread that embeds, once a document was read, and no other), so a busy CPU serves them
    first."""
    by_queue = {
        queue: p for p in workers for queue in ("ingest", "prefill", "decode") if f"{queue}@%h" in " ".join(p.args)
    }
    ingest, decode = by_queue["ingest"], by_queue["decode"]
    assert settings.APPLIANCE_INGEST_NICE == 10
    assert os.getpriority(os.PRIO_PROCESS, ingest.pid) == os.getpriority(os.PRIO_PROCESS, decode.pid) + 10
    cpu_class = settings.APPLIANCE_INGEST_CPU_CLASS
    assert os.sched_getscheduler(ingest.pid) == (os.SCHED_IDLE if cpu_class == "idle" else os.SCHED_OTHER)
    assert set(_thread_classes(decode.pid)) == {os.SCHED_OTHER}
    document = finished(upload(browser, "cpu-class.txt", b"The deposit is refunded within thirty days.").pk)
    assert document.state == Document.State.READY, document.failure_reason
    classes = _thread_classes(ingest.pid)
    if cpu_class == "idle-embedding":  # the batcher's thread (and any it started), the others not
        assert os.SCHED_IDLE in classes and os.SCHED_OTHER in classes
    elif cpu_class in ("nice", "idle-while-drafting"):  # idle-while-drafting: a batch's thread ends with it
        assert set(classes) == {os.SCHED_OTHER}
    else:
        assert set(classes) == {os.SCHED_IDLE}


def _draft(content: str, *, max_tokens: int):
    """A drafting request, straight to the engine host."""
    import uuid

    from inference.engine.protocol import GenerateRequest, Priority

    return GenerateRequest(
        request_id=f"test-{uuid.uuid4()}",
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        priority=Priority.DECODE,
        queue="decode",
    )


def test_while_the_engine_drafts_the_ingest_embeds_in_the_idle_cpu_class(browser, alice, workers, engine_host):
    """While this machine's engine runs a drafting request, the ingest worker's embedding runs in
    SCHED_IDLE (seen in /proc while a document is read), its other threads in the normal class:
    the embedding batcher's thread (idle-embedding, the default) or, with idle-while-drafting, the
    batch's own thread alone."""
    import uuid

    from django.conf import settings

    cpu_class = settings.APPLIANCE_INGEST_CPU_CLASS
    assert cpu_class in ("idle-embedding", "idle-while-drafting")
    (ingest,) = [p for p in workers if "ingest@%h" in " ".join(p.args)]
    draft = engine_host.generate(_draft("Write a very long story about a lighthouse keeper.", max_tokens=3000))
    seen: list[list[int]] = []
    try:
        next(iter(draft))  # admitted: drafting runs
        assert engine_host.activity()["drafting_requests"] == 1
        body = " ".join(f"Clause {i}: the tenant {uuid.uuid4().hex} pays rent on day {i % 28 + 1}." for i in range(600))
        document = upload(browser, "while-drafting.txt", body.encode())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and engine_host.activity()["drafting_requests"]:
            seen.append(_thread_classes(ingest.pid))
            if os.SCHED_IDLE in seen[-1]:
                break
            time.sleep(0.02)
    finally:
        draft.close()  # with the engine drafting on both cores, the idle class hardly runs
    assert seen and os.SCHED_IDLE in seen[-1], "no thread of the ingest worker embedded in SCHED_IDLE"
    assert os.SCHED_OTHER in seen[-1]
    if cpu_class == "idle-while-drafting":
        assert seen[-1].count(os.SCHED_IDLE) == 1  # the batch's thread alone
    document = finished(document.pk)
    assert document.state == Document.State.READY, document.failure_reason


def test_idle_while_drafting_follows_the_real_engines_drafting(engine_host):
    """APPLIANCE_INGEST_CPU_CLASS=idle-while-drafting, in a process of its own (the test's must
    keep its class and its embedder): the batcher of passages asks the real engine host, and
    embeds in SCHED_IDLE within the minute after a drafting request ran there. (A draft still
    running would starve the idle class on these two cores until it ended.)"""
    import subprocess
    import sys

    script = """
import os, django
django.setup()
from documents import embeddings
embeddings.embed_in_idle_class("while-drafting")
batcher = embeddings.passage_batcher()
rows = batcher.embed([f"The tenant pays rent on day {i}." for i in range(8)])
print(rows.shape[0], batcher.stats.batches, batcher.stats.idle_batches, os.environ["TOKENIZERS_PARALLELISM"])
"""
    events = list(engine_host.generate(_draft("Say hello.", max_tokens=4)))
    assert events[-1].type == "done"
    assert 0 <= engine_host.activity()["drafting_idle_s"] < 30
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows, batches, idle_batches, parallelism = out.stdout.split()
    assert (int(rows), int(batches), int(idle_batches), parallelism) == (8, 1, 1, "false")


def test_the_idle_cpu_class_moves_every_thread_and_what_starts_later():
    """APPLIANCE_INGEST_CPU_CLASS=idle: the ingest worker's threads (those already running, the
    pool's and torch's started later) and its extraction children run in SCHED_IDLE. Run in a
    process of its own: the test's must keep its class."""
    script = """
import os, subprocess, sys, threading
import django
django.setup()
from documents.tasks import idle_cpu_class
stop = threading.Event()
before = threading.Thread(target=stop.wait)
before.start()
moved = idle_cpu_class()
seen = {}
later = threading.Thread(target=lambda: seen.update(later=os.sched_getscheduler(0)))
later.start(); later.join()
child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"], capture_output=True, text=True)
print(moved, os.sched_getscheduler(0), os.sched_getscheduler(before.native_id), seen["later"], child.stdout.strip())
stop.set()
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    moved, main, before, later, child = (int(v) for v in out.stdout.split())
    assert moved >= 2
    assert main == before == later == child == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_the_ingest_workers_database_backends_yield_the_cpu_too(browser, alice, workers):
    """The Postgres backends that write the ingest's passages (and update their index) run at
    the ingest worker's niceness, not at full priority beside the drafters' job claims."""
    from django.db import connection

    ingest = next(p for p in workers if "ingest@%h" in " ".join(p.args))
    niceness = os.getpriority(os.PRIO_PROCESS, ingest.pid)
    document = finished(upload(browser, "backend-niceness.txt", b"The deposit is refunded within thirty days.").pk)
    assert document.state == Document.State.READY, document.failure_reason
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        backends = [pid for (pid,) in cursor.fetchall()]
    at = {}
    for pid in backends:
        with contextlib.suppress(ProcessLookupError):  # a backend that ended meanwhile
            at[pid] = os.getpriority(os.PRIO_PROCESS, pid)
    assert niceness > 0 and niceness in at.values(), at  # the ingest worker's pooled connections
