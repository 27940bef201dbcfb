"""``bench ingest``'s throughput part: the real ingest worker against pypdf + the embedder.

1. **Ratios**, repeated ``--rounds`` times with a 95 % interval. In each round, in alternating
   order, the same synthetic PDFs go
   - through the **worker path**: rows queued on the ``ingest`` queue, read by a Celery ingest
     worker started from the appliance's own declaration of processes (``make run``'s command
     line and pool), timed from the first task queued to the last document ready;
   - through the **direct baseline**: pypdf's text of each page, then ``embedder.encode`` of a
     document's pages, one document after another, in this process.

   Both embed with the same model on the same device and threads. Ratios: pages/s (the user's
   figure) and embedded tokens/s (the worker embeds passages, which overlap where a cut falls
   inside a sentence and run across pages, so not the same tokens as the baseline's one text
   per page: this one separates its overhead from that difference in work).
   The **embedder alone** (``encode`` of the worker's own passages in full batches, nothing
   else) is the ceiling of "as fast as the embedder allows".
2. **Backlog**: ``--backlog-pages`` pages in ``--backlog-document-pages``-page PDFs, queued at
   once, through the same worker: pages/s end to end, the time until the first document is
   searchable (ready), and the whole backlog's time.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

from measure.benchmarking import Progress, synthetic_rng, synthetic_text
from measure.intervals import Interval, format_entry, interval, meets

TARGET_PER_TOKEN = 0.95
TARGET_PER_PAGE = 0.9
POLL_S = 0.1


@dataclass
class Worker:
    processes: list
    log_dir: Path
    concurrency: int


def start_worker(progress: Progress, log_dir: Path, *, env: dict[str, str] | None = None) -> Worker:
    """The ingest worker as ``make run`` starts it (the one declaration of processes), named
    ``ingest-bench@host``, with ``env`` added to this process's environment (``bench scheduling``
    gives it its engine's socket, as ``make run`` gives every process the same one: the worker
    rests while that engine drafts). Refused when another ingest worker consumes the queue: it
    would take the benchmark's documents."""
    from appliance.processes import start_appliance_processes
    from measure.benchmarking import served_queues, wait_for_queues

    others = sorted(name for name, queues in served_queues().items() if "ingest" in queues)
    if others:
        raise CommandError(
            f"An ingest worker is running ({', '.join(others)}): stop `make run` first, or pass --skip-ingest; "
            "the benchmark starts its own worker and times the documents it reads."
        )
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE, **(env or {})}
    processes = start_appliance_processes(
        {"ingest-worker"}, settings=settings, tag="bench", env=env, log_dir=log_dir, tie_to_parent=True
    )
    wait_for_queues({"ingest"}, log_dir=log_dir, timeout_s=180)
    concurrency = settings.APPLIANCE_INGEST_CONCURRENCY
    progress(f"ingest worker started (threads pool of {concurrency}; log {log_dir / 'ingest-worker.log'})")
    return Worker(processes, log_dir, concurrency)


def stop_worker(worker: Worker | None) -> None:
    from appliance.processes import stop_groups

    if worker is not None:
        stop_groups(worker.processes)


@contextmanager
def reading(worker: Worker) -> Iterator[None]:
    """Inside ``appliance.processes.held(worker.processes)``: lets the worker read for the block,
    then holds it still again. ``bench scheduling`` measures drafting without the ingest in
    windows between windows with it, so that both see the same stretch of a shared machine."""
    from appliance.processes import signal_group

    for process in worker.processes:
        signal_group(process, signal.SIGCONT)
    try:
        yield
    finally:
        for process in worker.processes:
            signal_group(process, signal.SIGSTOP)


def pages_done(ids: list[int]) -> int:
    from django.db.models import Sum

    from documents.models import Document

    return Document.objects.filter(pk__in=ids).aggregate(n=Sum("pages_done"))["n"] or 0


def make_pdfs(n_documents: int, n_pages: int, seed: int) -> list[bytes]:
    """PDFs of pages of 110-160 words: about 150-230 word pieces, inside the model's 256, so that
    the baseline embeds all of each page's text as the appliance does."""
    from measure.bench_ingest import make_pdf

    rng = synthetic_rng(seed)
    return [make_pdf([synthetic_text(rng, rng.randint(110, 160)) for _ in range(n_pages)]) for _ in range(n_documents)]


def create_documents(owner, files: list[bytes], prefix: str) -> list[int]:
    from django.core.files.base import ContentFile

    from documents.models import Document

    ids = []
    for number, data in enumerate(files, 1):
        filename = f"{prefix}-{number:05d}.pdf"
        document = Document.objects.create(
            owner=owner,
            title=filename,
            filename=filename,
            kind=Document.Kind.PDF,
            content_type="application/pdf",
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            file=ContentFile(data, name=filename),
        )
        ids.append(document.pk)
    return ids


def queue(ids: list[int]) -> None:
    """Send ``ids`` to the ingest queue, as an upload does (each recorded as sent, so that the
    ingest worker's watchdog does not send it again)."""
    from documents.services import ingest_send

    for document_id in ids:
        ingest_send(document_id)


def unfinished(ids: list[int]):
    """The documents of ``ids`` not yet read; a new query at each call (an evaluated queryset's
    ``exists()`` answers from its cache)."""
    from documents.models import UNFINISHED_STATES, Document

    return Document.objects.filter(pk__in=ids, state__in=UNFINISHED_STATES)


def cancel(owner, ids: list[int], *, timeout_s: float = 300) -> None:
    """Cancel what is left of ``ids`` as their owner would (``documents.services.document_cancel``)
    and wait until the worker has stopped the ones it was reading."""
    from documents.services import document_cancel

    for document in unfinished(ids):
        document_cancel(document=document, user=owner)
    deadline = time.monotonic() + timeout_s
    while unfinished(ids).exists():
        if time.monotonic() > deadline:
            raise CommandError(f"the ingest worker did not stop its cancelled documents within {timeout_s:.0f} s")
        time.sleep(0.5)


def through_worker(ids: list[int], *, timeout_s: float) -> dict:
    """Queue ``ids`` (reset to uploaded) on the ingest queue; wait for every one to finish.
    Returns seconds to the first ready and to the last, and the failures."""
    from documents.models import Chunk, Document, Page

    Chunk.objects.filter(document_id__in=ids).delete()
    Page.objects.filter(document_id__in=ids).delete()
    Document.objects.filter(pk__in=ids).update(
        state=Document.State.UPLOADED,
        pages_done=0,
        attempts=0,
        failure_reason="",
        embedding_model="",
        dispatched_at=None,  # sent again by queue()
        reader=None,
        read_until=None,
        cancel_requested=False,
    )
    started = time.perf_counter()
    queue(ids)
    first_ready = None
    while True:
        states = dict(Document.objects.filter(pk__in=ids).values_list("pk", "state"))
        now = time.perf_counter() - started
        ready = sum(1 for state in states.values() if state == Document.State.READY)
        if ready and first_ready is None:
            first_ready = now
        finished = sum(1 for state in states.values() if state in (Document.State.READY, Document.State.FAILED))
        if finished == len(ids):
            break
        if now > timeout_s:
            raise CommandError(f"the ingest worker finished {finished} of {len(ids)} documents in {timeout_s:.0f} s")
        time.sleep(POLL_S)
    failed = dict(
        Document.objects.filter(pk__in=ids, state=Document.State.FAILED).values_list("pk", "failure_reason")[:5]
    )
    if failed:
        raise CommandError(f"the ingest worker failed benchmark documents: {failed}")
    return {"seconds": now, "first_ready_s": first_ready}


def baseline(files: list[bytes], embedder) -> float:
    """pypdf + encode, one document after another; seconds."""
    from measure.bench_ingest import _baseline

    started = time.perf_counter()
    for data in files:
        _baseline(data, embedder, settings.APPLIANCE_EMBEDDING_BATCH)
    return time.perf_counter() - started


def embedder_alone(ids: list[int], embedder) -> float:
    """``encode`` of the passages the worker stored, in full batches: the embedder's own time."""
    from documents.models import Chunk

    texts = list(
        Chunk.objects.filter(document_id__in=ids).order_by("document_id", "index").values_list("text", flat=True)
    )
    started = time.perf_counter()
    embedder.encode(texts, batch_size=settings.APPLIANCE_EMBEDDING_BATCH)
    return time.perf_counter() - started


def token_counts(files: list[bytes], ids: list[int], embedder) -> tuple[int, int, int]:
    """(tokens the worker embedded, tokens the baseline embedded, tokens the baseline lost to the
    model's limit), special tokens included."""
    from django.db.models import Count, Sum

    from documents.models import Chunk
    from measure.bench_ingest import _pdf_page_texts

    stored = Chunk.objects.filter(document_id__in=ids).aggregate(chunks=Count("id"), tokens=Sum("token_count"))
    special = 2  # [CLS] and [SEP]
    read_limit = embedder.max_seq_tokens - special
    counts = [
        len(embedder.tokenizer(text, add_special_tokens=False)["input_ids"])
        for data in files
        for text in _pdf_page_texts(data)
    ]
    appliance = (stored["tokens"] or 0) + special * (stored["chunks"] or 0)
    return (
        appliance,
        sum(min(count, read_limit) + special for count in counts),
        sum(max(0, count - read_limit) for count in counts),
    )


def ratios(progress: Progress, embedder, owner, *, n_documents: int, n_pages: int, rounds: int, seed: int) -> dict:
    if n_documents < 1 or n_pages < 1 or rounds < 1:
        raise CommandError("--documents, --pages and --rounds must be at least 1")
    progress(f"ingest: making {n_documents} PDFs of {n_pages} pages")
    files = make_pdfs(n_documents, n_pages, seed)
    ids = create_documents(owner, files, "bench")
    pages = n_documents * n_pages
    timeout_s = max(600.0, pages * 5.0)
    progress("ingest: warming up (the worker's model and sandbox, this process's model)")
    through_worker(ids[:2], timeout_s=timeout_s)
    baseline(files[:2], embedder)
    appliance_tokens = baseline_tokens = dropped = 0
    rows = []
    for number in range(1, rounds + 1):
        arms = ["worker", "baseline"] if number % 2 else ["baseline", "worker"]
        row: dict = {}
        for arm in arms:
            if arm == "worker":
                outcome = through_worker(ids, timeout_s=timeout_s)
                row["worker_s"] = outcome["seconds"]
                row["worker_first_ready_s"] = outcome["first_ready_s"]
            else:
                row["baseline_s"] = baseline(files, embedder)
        row["embedder_alone_s"] = embedder_alone(ids, embedder)
        if number == 1:
            appliance_tokens, baseline_tokens, dropped = token_counts(files, ids, embedder)
        row["per_page"] = row["baseline_s"] / row["worker_s"]
        row["per_token"] = (appliance_tokens / row["worker_s"]) / (baseline_tokens / row["baseline_s"])
        row["of_embedder"] = row["embedder_alone_s"] / row["worker_s"]
        rows.append(row)
        progress(
            f"ingest: round {number}/{rounds}: worker {row['worker_s']:.2f} s, baseline {row['baseline_s']:.2f} s, "
            f"embedder alone {row['embedder_alone_s']:.2f} s: per page {row['per_page']:.3f}, "
            f"per token {row['per_token']:.3f}"
        )
    per_page = interval([row["per_page"] for row in rows])
    per_token = interval([row["per_token"] for row in rows])
    of_embedder = interval([row["of_embedder"] for row in rows])
    return {
        "documents": n_documents,
        "pages": pages,
        "rounds": rows,
        "worker_concurrency": settings.APPLIANCE_INGEST_CONCURRENCY,
        "embedding_batch": settings.APPLIANCE_EMBEDDING_BATCH,
        "embedding_device": settings.APPLIANCE_EMBEDDING_DEVICE,
        "pages_per_s": {
            "worker": _dict(interval([pages / row["worker_s"] for row in rows])),
            "baseline": _dict(interval([pages / row["baseline_s"] for row in rows])),
        },
        "ratio_per_page": _dict(per_page),
        "ratio_per_token": _dict(per_token),
        "share_of_embedder_alone": _dict(of_embedder),
        "targets": {"per_page": TARGET_PER_PAGE, "per_token": TARGET_PER_TOKEN},
        "verdicts": {
            "per_page": meets(per_page, TARGET_PER_PAGE, below=False),
            "per_token": meets(per_token, TARGET_PER_TOKEN, below=False),
        },
        "worker_tokens_embedded": appliance_tokens,
        "baseline_tokens_embedded": baseline_tokens,
        "baseline_tokens_dropped_by_model_limit": dropped,
        "extra_tokens_of_overlap": round(appliance_tokens / baseline_tokens - 1, 4) if baseline_tokens else None,
    }


def backlog(
    progress: Progress, owner, *, pages: int, document_pages: int, seed: int, baseline_pages_per_s: float | None
) -> dict:
    n_documents = max(1, -(-pages // document_pages))
    progress(f"backlog: making {n_documents} PDFs of {document_pages} pages ({n_documents * document_pages:,} pages)")
    files = make_pdfs(n_documents, document_pages, seed + 1)
    ids = create_documents(owner, files, "backlog")
    total = n_documents * document_pages
    progress(f"backlog: {n_documents} documents queued at once; waiting for the worker")
    outcome = through_worker(ids, timeout_s=max(1800.0, total * 2.0))
    rate = total / outcome["seconds"]
    progress(
        f"backlog: {total:,} pages in {outcome['seconds']:.0f} s ({rate:.1f} pages/s); "
        f"first document searchable after {outcome['first_ready_s']:.1f} s"
    )
    return {
        "documents": n_documents,
        "pages": total,
        "seconds": round(outcome["seconds"], 1),
        "pages_per_s": round(rate, 2),
        "first_searchable_s": round(outcome["first_ready_s"], 2),
        "of_baseline_pages_per_s": round(rate / baseline_pages_per_s, 3) if baseline_pages_per_s else None,
    }


def _dict(value: Interval | None) -> dict | None:
    return None if value is None else value.to_dict()


def table(ingest: dict) -> list[str]:
    lines = []
    ratios_ = ingest.get("ratios")
    if ratios_:
        pps = ratios_["pages_per_s"]
        lines += [
            f"INGEST  {ratios_['documents']} PDFs, {ratios_['pages']} pages, {len(ratios_['rounds'])} rounds (arms "
            f"alternate), mean [95 % interval]; worker: threads pool of {ratios_['worker_concurrency']}, "
            f"batches of {ratios_['embedding_batch']} on {ratios_['embedding_device']}",
            f"  worker path pages/s        {_fmt(pps['worker'])}",
            f"  baseline pages/s           {_fmt(pps['baseline'])}   (pypdf + encode, document by document)",
            f"  worker / baseline per page  {_fmt(ratios_['ratio_per_page'])}   target >= {TARGET_PER_PAGE}: "
            f"{ratios_['verdicts']['per_page']}",
            f"  worker / baseline per token {_fmt(ratios_['ratio_per_token'])}   target >= {TARGET_PER_TOKEN}: "
            f"{ratios_['verdicts']['per_token']}",
            f"  worker / embedder alone     {_fmt(ratios_['share_of_embedder_alone'])}   (encode of the worker's own "
            "passages, full batches, nothing else)",
            f"  tokens embedded: worker {ratios_['worker_tokens_embedded']:,}, baseline "
            f"{ratios_['baseline_tokens_embedded']:,} (the worker's passages: "
            f"{100 * (ratios_['extra_tokens_of_overlap'] or 0):+.1f} %); the baseline lost "
            f"{ratios_['baseline_tokens_dropped_by_model_limit']:,} to the model's limit",
        ]
    backlog_ = ingest.get("backlog")
    if backlog_:
        of = backlog_["of_baseline_pages_per_s"]
        lines.append(
            f"  backlog {backlog_['pages']:,} pages ({backlog_['documents']} PDFs) queued at once: "
            f"{backlog_['seconds']:.0f} s, {backlog_['pages_per_s']:.1f} pages/s"
            + (f" ({of:.2f}x the baseline's mean)" if of else "")
            + f"; first document searchable after {backlog_['first_searchable_s']:.1f} s"
        )
    return lines


def _fmt(entry: dict | None) -> str:
    return format_entry(entry, digits=3, missing="n/a")
