"""``manage.py bench ingest``: ingest throughput and search quality/latency, measured in one run.

1. Ingest (``measure/ingest_throughput.py``): synthetic PDFs through the real ingest worker
   (started as ``make run`` starts it: sandboxed extraction, pages, chunking in the embedding
   model's tokens, passages of several documents embedded together, chunk rows with their
   full-text vectors) and, on the same files, through the direct baseline (pypdf, then
   ``embedder.encode`` of each page's text), in rounds with a 95 % interval; targets >= 0.9x
   per page and >= 0.95x per embedded token. Then a backlog (``--backlog-pages``, 10,000 by
   default) queued at once: pages/s and the time to the first document searchable. A
   breakdown shows where the appliance's time goes.
2. Search: a synthetic corpus of ``--chunks`` chunks (random unit vectors clustered around 200
   centres, each cluster spread along its own few directions as real embeddings are, plus text)
   is loaded with COPY and indexed with the HNSW index of the Chunk table; perturbed corpus
   vectors are the queries. Recall@10 of the index search (as users search: with the access
   filter) against an exact sequential scan, and its latency p50/p95; targets >= 0.95 and
   < 50 ms. The full hybrid search (query embedding + both arms + fetch) is timed as well, and
   so is the search of each reply gold set letter's whole text (``--letter-rounds`` times), the
   longest query a draft makes (up to ``search.MAX_QUERY_TERMS`` terms for the words arm). The
   corpus is one document, or ``--corpus-documents`` of equal size: a library of many
   documents, as the words arm's term counts see one.

The benchmark's rows belong to an inactive user of its own and are deleted at the end (``--keep``
keeps them; the next run deletes them first). Loading drops the HNSW index and builds it again
after the load (much faster than inserting into it row by row); searches of a running appliance
fall back to exact scans meanwhile.

Against the embedded database this starts it if it is not running (and stops it at the end).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import random
import statistics
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.management.base import CommandError

from measure.benchmarking import (
    Progress,
    bench_user,
    check_migrated,
    ensure_embedded_broker,
    ensure_embedded_database,
    ingest_worker,
    machine,
    synthetic_rng,
)

HELP = "ingest pages/s against pypdf + encode, and HNSW search recall@10 and latency on a synthetic corpus"

BENCH_USERNAME = "bench-ingest"
BENCH_READER = "bench-ingest-reader"
BENCH_GROUP = "bench-ingest"
SYNTHETIC_MODEL = "synthetic (bench)"
HNSW_INDEX_NAME = "chunk_embedding_hnsw"

TARGET_RECALL = 0.95
TARGET_P95_MS = 50.0


def add_arguments(parser) -> None:
    parser.add_argument("--documents", type=int, default=20, help="synthetic PDFs for the ingest ratios")
    parser.add_argument("--pages", type=int, default=10, help="pages per PDF")
    parser.add_argument("--rounds", type=int, default=3, help="ingest rounds (each arm once per round)")
    parser.add_argument("--backlog-pages", type=int, default=10_000, help="pages of the backlog (0: none)")
    parser.add_argument("--backlog-document-pages", type=int, default=20, help="pages per PDF of the backlog")
    parser.add_argument("--chunks", type=int, default=100_000, help="chunks in the synthetic search corpus")
    parser.add_argument("--queries", type=int, default=200, help="vector queries for recall and latency")
    parser.add_argument("--text-queries", type=int, default=50, help="queries for the hybrid search timing")
    parser.add_argument(
        "--corpus-documents", type=int, default=1, help="documents the synthetic corpus's chunks are spread over"
    )
    parser.add_argument(
        "--letter-rounds",
        type=int,
        default=2,
        help="times each reply gold set letter's whole text is searched (0: none)",
    )
    parser.add_argument("--seed", type=int, default=20260301)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's documents and chunks")
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--skip-search", action="store_true")


def run(command, **options) -> dict:
    def write(line: str) -> None:
        command.stdout.write(line)
        command.stdout.flush()

    progress = Progress(write)
    started_postgres = ensure_embedded_database(progress)
    started_broker = None if options["skip_ingest"] else ensure_embedded_broker(progress)
    try:
        check_migrated(progress)
        from documents.embeddings import get_embedder

        owner = bench_user(BENCH_USERNAME)
        _remove_bench_data(progress, owner)  # left by an interrupted run or by --keep
        _ensure_hnsw_index(progress)
        progress("loading the embedding model")
        embedder = get_embedder()
        results: dict = {
            "machine": machine(),
            "ingest_worker": ingest_worker(),
            "parameters": {k: options[k] for k in _PARAMETERS},
        }
        try:
            if not options["skip_ingest"]:
                results["ingest"] = _bench_ingest(progress, embedder, owner, options)
            if not options["skip_search"]:
                results["search"] = _bench_search(
                    progress,
                    embedder,
                    owner,
                    n_chunks=options["chunks"],
                    n_queries=options["queries"],
                    n_text_queries=options["text_queries"],
                    n_documents=options["corpus_documents"],
                    letter_rounds=options["letter_rounds"],
                    seed=options["seed"],
                )
        finally:
            _ensure_hnsw_index(progress)
            if options["keep"]:
                progress(f"keeping the benchmark's rows (user {BENCH_USERNAME!r})")
            else:
                _remove_bench_data(progress, owner, remove_owner=True)
        write("")
        for line in _table(results):
            write(line)
        return results
    finally:
        if started_broker is not None:
            progress("stopping the embedded Valkey this benchmark started")
            started_broker.stop()
        if started_postgres is not None:
            progress("stopping the embedded Postgres this benchmark started")
            started_postgres.stop()


_PARAMETERS = (
    "documents", "pages", "rounds", "backlog_pages", "backlog_document_pages", "chunks", "queries", "text_queries",
    "corpus_documents", "letter_rounds", "seed", "keep",
)  # fmt: skip


# --- set-up ----------------------------------------------------------------------------------


def _hnsw_index():
    from documents.models import Chunk

    return next(index for index in Chunk._meta.indexes if index.name == HNSW_INDEX_NAME)


def _index_exists() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [HNSW_INDEX_NAME])
        return cursor.fetchone() is not None


def _ensure_hnsw_index(progress) -> float:
    """Build the HNSW index if it is missing (dropped by this benchmark). Returns seconds taken."""
    from django.db import connection

    from documents.models import Chunk

    if _index_exists():
        return 0.0
    progress(f"building the HNSW index {HNSW_INDEX_NAME}")
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM documents_chunk")
        (rows,) = cursor.fetchone()
        # The graph must fit in maintenance_work_mem, or the build slows down many times.
        memory_mb = min(8192, max(256, rows * 4 // 1024))
        cursor.execute(f"SET maintenance_work_mem = '{memory_mb}MB'")
    try:
        with connection.schema_editor() as editor:
            editor.add_index(Chunk, _hnsw_index())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET maintenance_work_mem")
    return time.perf_counter() - started


def _drop_hnsw_index(progress) -> None:
    from django.db import connection

    from documents.models import Chunk

    if _index_exists():
        progress(f"dropping the HNSW index {HNSW_INDEX_NAME} for the bulk load (it is built again after)")
        with connection.schema_editor() as editor:
            editor.remove_index(Chunk, _hnsw_index())


def _remove_bench_data(progress, owner, *, remove_owner: bool = False) -> None:
    from django.core.files.storage import default_storage
    from django.db import connection

    from documents.models import Chunk, Document

    documents = Document.objects.filter(owner=owner)
    chunks = Chunk.objects.filter(document__owner=owner).count()
    if documents.exists():
        progress(f"removing the benchmark's rows ({documents.count()} documents, {chunks:,} chunks)")
        files = [name for name in documents.values_list("file", flat=True) if name]
        with connection.cursor() as cursor:  # one statement, not 100,000 objects through the ORM
            cursor.execute(
                "DELETE FROM documents_chunk WHERE document_id IN (SELECT id FROM documents_document WHERE owner_id = %s)",
                [owner.pk],
            )
        documents.delete()
        for name in files:
            default_storage.delete(name)
    if chunks:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM documents_chunk")
            (remaining,) = cursor.fetchone()
            # Rebuilding the index without the deleted rows is quicker than vacuuming them out
            # of the graph, while the rows left are fewer than those deleted.
            if remaining < chunks and _index_exists():
                progress(f"rebuilding {HNSW_INDEX_NAME} over the {remaining:,} chunks left")
                cursor.execute(f"REINDEX INDEX {HNSW_INDEX_NAME}")
            cursor.execute("ANALYZE documents_chunk")
    if remove_owner:
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group

        get_user_model().objects.filter(username=BENCH_READER).delete()
        Group.objects.filter(name=BENCH_GROUP).delete()
        owner.delete()


# --- 1. ingest -------------------------------------------------------------------------------


def _wrap(text: str, width: int = 90) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def make_pdf(pages: list[str]) -> bytes:
    """A PDF whose page i shows pages[i] in Helvetica, wrapped (pypdf, as tests/pdfs.py does)."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    font = writer._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )
    for text in pages:
        page = writer.add_blank_page(width=612, height=792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        ops = ["BT", "/F1 10 Tf", "13 TL", "60 750 Td"]
        for line in _wrap(text):
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            ops.append(f"({escaped}) Tj T*")
        ops.append("ET")
        stream = DecodedStreamObject()
        stream.set_data("\n".join(ops).encode("latin-1"))
        page[NameObject("/Contents")] = writer._add_object(stream)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def _baseline(data: bytes, embedder, batch_size: int) -> list[str]:
    """The direct way: pypdf's text of each page, embedded as it is."""
    from pypdf import PdfReader

    texts = [page.extract_text() or "" for page in PdfReader(io.BytesIO(data)).pages]
    embedder.encode(texts, batch_size=batch_size)
    return texts


def _bench_ingest(progress, embedder, owner, options: dict) -> dict:
    from pathlib import Path

    from measure import ingest_throughput

    worker = ingest_throughput.start_worker(progress, Path(settings.VAR_DIR) / "bench" / "logs")
    try:
        sizes = {"n_documents": options["documents"], "n_pages": options["pages"], "rounds": options["rounds"]}
        result: dict = {"ratios": ingest_throughput.ratios(progress, embedder, owner, seed=options["seed"], **sizes)}
        if options["backlog_pages"]:
            result["backlog"] = ingest_throughput.backlog(
                progress,
                owner,
                pages=options["backlog_pages"],
                document_pages=options["backlog_document_pages"],
                seed=options["seed"],
                baseline_pages_per_s=result["ratios"]["pages_per_s"]["baseline"]["mean"],
            )
    finally:
        ingest_throughput.stop_worker(worker)
    progress("ingest: timing the appliance's steps one by one (breakdown)")
    files = ingest_throughput.make_pdfs(options["documents"], options["pages"], options["seed"])
    result["breakdown_s"] = _ingest_breakdown(files, embedder, settings.APPLIANCE_EMBEDDING_BATCH)
    return result


def _has_sandbox() -> bool:
    try:
        from documents.sandbox import extract_in_sandbox  # noqa: F401
    except ImportError:
        return False
    return True


def _extract_in_process(data: bytes, *, filename: str = "", content_type: str = "", limits=None, **_):
    from documents import extraction

    return extraction.extract(
        data, filename=filename, content_type=content_type, limits=limits or extraction.DEFAULT_LIMITS
    )


def _pdf_page_texts(data: bytes) -> list[str]:
    from pypdf import PdfReader

    return [page.extract_text() or "" for page in PdfReader(io.BytesIO(data)).pages]


def _ingest_breakdown(files: list[bytes], embedder, batch_size: int) -> dict[str, float]:
    """The appliance's ingest steps, timed one by one on the same files (no database writes)."""
    from documents.chunking import chunk_pages, document_text, pages_with_offsets
    from documents.embeddings import embed_spans, headings_for
    from documents.extraction import extract
    from documents.sandbox import extract_in_sandbox

    max_tokens = settings.APPLIANCE_CHUNK_TOKENS
    overlap_tokens = settings.APPLIANCE_CHUNK_OVERLAP_TOKENS
    spent = {"extraction_in_sandbox_s": 0.0, "extraction_in_process_s": 0.0, "chunking_s": 0.0, "embedding_s": 0.0}
    for number, data in enumerate(files, 1):
        filename = f"bench-{number:03d}.pdf"
        started = time.perf_counter()
        extract_in_sandbox(data, filename=filename)
        spent["extraction_in_sandbox_s"] += time.perf_counter() - started
        started = time.perf_counter()
        extracted = extract(data, filename=filename)
        spent["extraction_in_process_s"] += time.perf_counter() - started
        texts = [page.text for page in extracted.pages]
        started = time.perf_counter()
        pages = pages_with_offsets(texts)
        spans = chunk_pages(pages, embedder.tokenizer, max_tokens=max_tokens, overlap_tokens=overlap_tokens)
        headings = headings_for(embedder, document_text(pages), spans)
        spent["chunking_s"] += time.perf_counter() - started
        started = time.perf_counter()
        embed_spans(embedder, spans, batch_size=batch_size, headings=headings)
        spent["embedding_s"] += time.perf_counter() - started
    return spent


# --- 2. search -------------------------------------------------------------------------------

_TOPICS = (
    "payroll", "invoice", "tenancy", "warranty", "insurance", "escrow", "licence", "audit", "delivery", "pension",
    "procurement", "maintenance", "termination", "liability", "privacy", "training", "safety", "budget", "travel",
    "recruitment", "overtime", "refund", "shipping", "customs", "catering", "parking", "security", "backup",
)  # fmt: skip
_FILLER = (
    "the", "agreement", "party", "notice", "period", "schedule", "report", "records", "customer", "supplier",
    "month", "quarter", "clause", "review", "approval", "request", "costs", "terms", "update", "team", "office",
)  # fmt: skip


def _corpus_text(rng: random.Random, cluster: int) -> str:
    topic = _TOPICS[cluster % len(_TOPICS)]
    second = _TOPICS[(cluster * 7 + 3) % len(_TOPICS)]
    words = [rng.choice((topic, second, *_FILLER)) for _ in range(rng.randint(12, 30))]
    return f"{topic.capitalize()} {' '.join(words)} ref C{cluster}-{rng.randint(1, 999)}."


def _unit(rows):
    import numpy as np

    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


@dataclass(frozen=True)
class _ClusteredVectors:
    """Unit vectors around ``clusters`` random centres; each cluster varies mostly along its own
    ``rank`` random directions (embeddings of real text have few effective dimensions), plus a
    little noise in all of them."""

    dimensions: int
    clusters: int = 200
    rank: int = 24
    spread: float = 0.7  # length of the in-cluster variation, relative to the centre's 1
    noise: float = 0.25  # length of the isotropic noise

    def generator(self, seed: int):
        import numpy as np

        rng = np.random.default_rng(seed)
        centres = _unit(rng.standard_normal((self.clusters, self.dimensions)))
        # Rows of about unit length, so that the variation has about the length ``spread``.
        directions = rng.standard_normal((self.clusters, self.rank, self.dimensions)) / np.sqrt(self.dimensions)

        def batch(size: int):
            labels = rng.integers(self.clusters, size=size)
            rows = centres[labels].astype(np.float64)
            weights = rng.standard_normal((size, self.rank)) * (self.spread / np.sqrt(self.rank))
            for cluster in np.unique(labels):
                members = labels == cluster
                rows[members] += weights[members] @ directions[cluster]
            rows += rng.standard_normal((size, self.dimensions)) * (self.noise / np.sqrt(self.dimensions))
            return labels, _unit(rows)

        return batch


def _load_corpus(progress, owner, n_chunks: int, seed: int, dimensions: int, n_queries: int, n_documents: int = 1):
    """Insert the synthetic corpus with COPY, its chunks spread evenly over ``n_documents``
    documents; returns (documents, query vectors)."""
    import numpy as np
    from django.db import connection, transaction
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo

    from documents.models import Document

    n_documents = max(1, min(n_documents, n_chunks))
    corpus = Document.objects.bulk_create(
        Document(
            owner=owner,
            title="Benchmark corpus (synthetic)" if n_documents == 1 else f"Benchmark corpus (synthetic) {number}",
            filename="bench-corpus.txt",
            kind=Document.Kind.TEXT,
            size_bytes=0,
            sha256=hashlib.sha256(f"bench corpus {seed} {n_chunks} {number}".encode()).hexdigest(),
            state=Document.State.READY,
            embedding_model=SYNTHETIC_MODEL,
        )
        for number in range(1, n_documents + 1)
    )
    document_ids = [document.pk for document in corpus]
    text_rng = synthetic_rng(seed)
    np_rng = np.random.default_rng(seed + 1)
    query_rows = set(np_rng.choice(n_chunks, size=min(n_queries, n_chunks), replace=False).tolist())
    sources = []
    batch = _ClusteredVectors(dimensions=dimensions).generator(seed)
    batch_rows = 10_000
    with transaction.atomic(), connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own cursor, for COPY
        register_vector_info(raw, TypeInfo.fetch(raw.connection, "vector"))
        cursor.execute(
            "CREATE TEMPORARY TABLE bench_chunk_load (position integer, text text, token_count integer, "
            f"embedding vector({dimensions})) ON COMMIT DROP"
        )
        for first in range(0, n_chunks, batch_rows):
            size = min(batch_rows, n_chunks - first)
            labels, vectors = batch(size)
            with raw.copy(
                "COPY bench_chunk_load (position, text, token_count, embedding) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["integer", "text", "integer", "vector"])
                for offset in range(size):
                    position = first + offset
                    text = _corpus_text(text_rng, int(labels[offset]))
                    copy.write_row((position, text, len(text.split()), vectors[offset]))
                    if position in query_rows:
                        sources.append(vectors[offset])
            cursor.execute(
                """
                INSERT INTO documents_chunk (document_id, "index", page_start, page_end, char_start, char_end, text,
                                             token_count, embedding, embedding_model, search_vector)
                SELECT (%s::bigint[])[position * %s / %s + 1], position, 1, 1, 0, length(text), text, token_count,
                       embedding, %s, to_tsvector('english', text)
                FROM bench_chunk_load
                """,
                [document_ids, n_documents, n_chunks, SYNTHETIC_MODEL],
            )
            cursor.execute("TRUNCATE bench_chunk_load")
            progress(f"search: loaded {first + size:,}/{n_chunks:,} chunks")
    # Queries: corpus vectors moved a little, as a question is near, not on, its passage.
    vectors = np.asarray(sources, dtype=np.float32)
    queries = _unit(vectors + np_rng.standard_normal(vectors.shape) * (0.15 / np.sqrt(dimensions)))
    return corpus, queries


def _count_corpus_terms(progress, document_ids: list[int]) -> None:
    """The corpus's term counts (``documents.term_counts``), as storing a document's passages
    counts them, one document at a time."""
    from django.db import connection, transaction

    from documents.term_counts import store_document_terms

    progress(f"search: counting the terms of {len(document_ids):,} document(s)")
    for document_id in document_ids:
        with transaction.atomic():
            store_document_terms(document_id)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE documents_documentterm")


def _percentile(values: list[float], percent: float) -> float:
    import numpy as np

    return float(np.percentile(values, percent))


def _timed_searches(queries, truths, search, k: int) -> tuple[list[float], list[float]]:
    """Run ``search`` on each query; (latencies in ms, recall@k of each against ``truths``)."""
    latencies, recalls = [], []
    for query, truth in zip(queries, truths, strict=True):
        started = time.perf_counter()
        found = search(query)
        latencies.append((time.perf_counter() - started) * 1000)
        # Of the true neighbours (fewer than k when the user may read fewer chunks), how many came back.
        recalls.append(len({chunk_id for chunk_id, _ in found} & set(truth)) / max(1, min(k, len(truth))))
    return latencies, recalls


def _summary(latencies: list[float], recalls: list[float]) -> dict:
    return {
        "recall_at_10": statistics.fmean(recalls),
        "queries_below_half_recall": sum(1 for recall in recalls if recall < 0.5),
        "p50_ms": _percentile(latencies, 50),
        "p95_ms": _percentile(latencies, 95),
    }


def _bench_search(
    progress,
    embedder,
    owner,
    *,
    n_chunks: int,
    n_queries: int,
    n_text_queries: int,
    seed: int,
    n_documents: int = 1,
    letter_rounds: int = 0,
) -> dict:
    from django.db import connection

    from documents import search
    from documents.models import Chunk

    if n_chunks < 1 or n_queries < 1:
        raise CommandError("--chunks and --queries must be at least 1")
    k = 10
    ef_search = settings.APPLIANCE_SEARCH_EF_SEARCH
    progress(f"search: generating and loading {n_chunks:,} synthetic chunks")
    _drop_hnsw_index(progress)
    started = time.perf_counter()
    corpus, queries = _load_corpus(progress, owner, n_chunks, seed, embedder.dimensions, n_queries, n_documents)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    _count_corpus_terms(progress, [document.pk for document in corpus])
    term_counts_s = time.perf_counter() - started
    build_s = _ensure_hnsw_index(progress)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE documents_chunk")
        cursor.execute("SELECT count(*) FROM documents_chunk")
        (table_rows,) = cursor.fetchone()
    progress(f"search: index built in {build_s:.1f} s; {table_rows:,} chunks in the table")

    readable = search.searchable_document_ids(owner)
    walks_index = not search.uses_exact_search(readable)
    plan = search.explain_vector_search(queries[0], limit=k, user=owner)

    progress(f"search: exact nearest {k} of {len(queries)} queries (sequential scans)")
    truths, exact_ms = [], []
    for query in queries:
        started = time.perf_counter()
        truths.append([chunk_id for chunk_id, _ in search.exact_vector_search(query, k, user=owner)])
        exact_ms.append((time.perf_counter() - started) * 1000)

    progress(f"search: HNSW searches of the same {len(queries)} queries, as the user who owns the corpus")
    for query in queries[:20]:  # bring the index into memory
        search.vector_search(query, limit=k, user=owner)
    latencies, recalls = _timed_searches(queries, truths, lambda q: search.vector_search(q, limit=k, user=owner), k)
    results = {
        "chunks": n_chunks,
        "documents": len(corpus),
        "table_rows": table_rows,
        "queries": len(queries),
        "k": k,
        "ef_search": ef_search,
        "vectors": dataclasses.asdict(_ClusteredVectors(dimensions=embedder.dimensions)),
        "load_s": load_s,
        "term_counts_s": term_counts_s,
        "index_build_s": build_s,
        "walks_hnsw_index": walks_index,
        "plan_uses_hnsw_index": HNSW_INDEX_NAME in plan,
        "plan": plan,
        "hnsw": _summary(latencies, recalls),
        "exact_p50_ms": _percentile(exact_ms, 50),
        "exact_p95_ms": _percentile(exact_ms, 95),
        "target_recall": TARGET_RECALL,
        "target_p95_ms": TARGET_P95_MS,
    }

    progress("search: recall and latency for other values of hnsw.ef_search")
    results["ef_search_sweep"] = {}
    for value in sorted({40, 100, 200, 400} - {ef_search}):
        latencies, recalls = _timed_searches(
            queries, truths, lambda q, ef=value: search.vector_search(q, limit=k, user=owner, ef_search=ef), k
        )
        results["ef_search_sweep"][value] = _summary(latencies, recalls)
    results["ef_search_sweep"][ef_search] = results["hnsw"]

    reader = _bench_reader(owner)
    if reader is not None:
        shared = search.searchable_document_ids(reader)
        chunks = Chunk.objects.filter(document_id__in=shared).count()
        progress(f"search: the same queries as a user who may read one document ({chunks} chunks)")
        reader_truths = [[c for c, _ in search.exact_vector_search(q, k, user=reader)] for q in queries]
        latencies, recalls = _timed_searches(
            queries, reader_truths, lambda q: search.vector_search(q, limit=k, user=reader), k
        )
        results["one_document_reader"] = {
            "chunks": chunks,
            "walks_hnsw_index": not search.uses_exact_search(shared),
            **_summary(latencies, recalls),
        }

    if n_text_queries > 0:
        progress(f"search: {n_text_queries} hybrid searches (query embedding + both arms + fetch)")
        rng = synthetic_rng(seed + 2)
        texts = [_corpus_text(rng, rng.randrange(200)) for _ in range(n_text_queries + 5)]
        for text in texts[:5]:
            search.search_passages(user=owner, query=text, embedder=embedder)
        hybrid_ms = []
        for text in texts[5:]:
            started = time.perf_counter()
            search.search_passages(user=owner, query=text, embedder=embedder)
            hybrid_ms.append((time.perf_counter() - started) * 1000)
        results["hybrid_p50_ms"] = _percentile(hybrid_ms, 50)
        results["hybrid_p95_ms"] = _percentile(hybrid_ms, 95)
    if letter_rounds > 0:
        results["letters"] = _bench_letter_search(progress, embedder, owner, rounds=letter_rounds)
    return results


def _time_alternately(ways: dict, items: list, *, rounds: int) -> tuple[dict[str, list[float]], dict[str, list]]:
    """Each way called on each item, ``rounds`` times, the ways' order alternating from one call
    to the next, so that all see the same minutes of a shared machine: each way's latencies
    (ms) and answers, in the order of the calls."""
    latencies: dict[str, list[float]] = {name: [] for name in ways}
    answers: dict[str, list] = {name: [] for name in ways}
    for round_ in range(rounds):
        for number, item in enumerate(items):
            for name in list(ways) if (round_ + number) % 2 == 0 else list(reversed(ways)):
                started = time.perf_counter()
                answers[name].append(ways[name](item))
                latencies[name].append((time.perf_counter() - started) * 1000)
    return latencies, answers


def _bench_letter_search(progress, embedder, owner, *, rounds: int) -> dict:
    """``search_passages`` of each reply gold set letter's whole text (the first query of a
    draft's retrieval, ``drafting.retrieval_queries``), ``rounds`` times each, over the corpus;
    and the same search with its terms counted in the full-text index, one count a term, as the
    words arm counted them before the stored counts (``term_counts.passage_counts_from_index``),
    the two in alternating order, so that both see the same minutes of a shared machine."""
    from unittest import mock

    from documents import search
    from documents.term_counts import passage_counts_from_index
    from inference.drafting import retrieval_queries
    from measure.evaluation.gold import load_gold_set

    letters = [retrieval_queries(case.message)[0] for case in load_gold_set().replies]
    progress(f"search: each of {len(letters)} letters' whole text, {rounds} times, each way")
    search.search_passages(user=owner, query=letters[0], embedder=embedder)  # the index and the model warm

    def counted_per_term(letter: str) -> None:
        with mock.patch.object(search, "passage_counts", passage_counts_from_index):
            search.search_passages(user=owner, query=letter, embedder=embedder)

    ways = {
        "stored": lambda letter: search.search_passages(user=owner, query=letter, embedder=embedder),
        "counted_per_term": counted_per_term,
    }
    latencies, _ = _time_alternately(ways, letters, rounds=rounds)
    stored = latencies["stored"]
    before = latencies["counted_per_term"]
    return {
        "letters": len(letters),
        "searches": len(stored),
        "terms": [len(search.significant_terms(letter)) for letter in letters],
        "p50_ms": _percentile(stored, 50),
        "p95_ms": _percentile(stored, 95),
        "latencies_ms": stored,
        "counted_per_term_p50_ms": _percentile(before, 50),
        "counted_per_term_p95_ms": _percentile(before, 95),
        "counted_per_term_latencies_ms": before,
        "term_counts": _bench_term_counts(progress, owner, letters, rounds=rounds),
    }


def _bench_term_counts(progress, owner, letters: list[str], *, rounds: int) -> dict:
    """The words arm's counts of each letter's terms: from the stored counts (one query, as
    search reads them) and from the full-text index (one count per term, as it read them
    before), in alternating order; and whether the two agree."""
    from documents import search
    from documents.term_counts import passage_counts, passage_counts_from_index

    progress("search: each letter's term counts, stored against counted in the full-text index")
    readable = search.searchable_document_ids(owner)
    ways = {
        name: lambda terms, count=count: count(readable, terms, config=search.SEARCH_CONFIG)
        for name, count in (("stored", passage_counts), ("full_text_index", passage_counts_from_index))
    }
    latencies, found = _time_alternately(ways, [search.significant_terms(letter) for letter in letters], rounds=rounds)
    return {
        "disagreements": sum(a != b for a, b in zip(found["stored"], found["full_text_index"], strict=True)),
        **{f"{name}_p50_ms": _percentile(values, 50) for name, values in latencies.items()},
        **{f"{name}_p95_ms": _percentile(values, 95) for name, values in latencies.items()},
    }


def _bench_reader(owner):
    """A user who may read one of the ingest benchmark's documents (shared through a group), or
    None when the ingest part did not run."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from documents.models import Document

    document = Document.objects.filter(owner=owner, state=Document.State.READY, kind=Document.Kind.PDF).first()
    if document is None:
        return None
    group, _ = Group.objects.get_or_create(name=BENCH_GROUP)
    reader, created = get_user_model().objects.get_or_create(username=BENCH_READER, defaults={"is_active": False})
    if created:
        reader.set_unusable_password()
        reader.save(update_fields=["password"])
    reader.groups.add(group)
    document.shared_with.add(group)
    return reader


# --- the table -------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _table(results: dict) -> list[str]:
    lines = []
    ingest = results.get("ingest")
    if ingest:
        from measure.ingest_throughput import table as ingest_table

        lines += ingest_table(ingest)
        breakdown = ingest["breakdown_s"]
        lines.append("  the worker's steps timed alone, one after another, on the ratios' files:")
        total = sum(value for name, value in breakdown.items() if name != "extraction_in_process_s")
        for name, seconds in breakdown.items():
            label = name.removesuffix("_s").replace("_", " ")
            share = "" if name == "extraction_in_process_s" else f"  {100 * seconds / total:>5.1f} %"
            lines.append(f"    {label:<40} {seconds:>7.2f} s{share}")
        lines.append("")
    search = results.get("search")
    if search:
        hnsw = search["hnsw"]
        index_used = "yes" if search["plan_uses_hnsw_index"] and search["walks_hnsw_index"] else "NO"
        lines += [
            f"SEARCH  {search['chunks']:,} synthetic chunks in {search.get('documents', 1):,} document(s) "
            f"({search['table_rows']:,} in the table), "
            f"{search['queries']} queries, k={search['k']}, hnsw.ef_search={search['ef_search']}",
            f"  load (COPY + full-text vectors) {search['load_s']:.1f} s, term counts "
            f"{search.get('term_counts_s', 0.0):.1f} s, HNSW index build "
            f"{search['index_build_s']:.1f} s, query plan walks the HNSW index: {index_used}",
            f"  HNSW recall@10 vs exact scan: {hnsw['recall_at_10']:.3f}  (target >= {search['target_recall']:.2f})  "
            f"{_verdict(hnsw['recall_at_10'] >= search['target_recall'])}; "
            f"{hnsw['queries_below_half_recall']} queries found under half their neighbours",
            f"  HNSW search latency: p50 {hnsw['p50_ms']:.1f} ms, p95 {hnsw['p95_ms']:.1f} ms  "
            f"(target p95 < {search['target_p95_ms']:.0f} ms)  {_verdict(hnsw['p95_ms'] < search['target_p95_ms'])}",
            f"  exact sequential scan:  p50 {search['exact_p50_ms']:.1f} ms, p95 {search['exact_p95_ms']:.1f} ms",
            "  hnsw.ef_search   recall@10   queries < 0.5   p50 ms   p95 ms",
        ]
        for value, row in sorted(search["ef_search_sweep"].items(), key=lambda item: int(item[0])):
            lines.append(
                f"  {value:>14}   {row['recall_at_10']:>9.3f}   {row['queries_below_half_recall']:>13}   "
                f"{row['p50_ms']:>6.1f}   {row['p95_ms']:>6.1f}"
            )
        reader = search.get("one_document_reader")
        if reader:
            path = "HNSW index" if reader["walks_hnsw_index"] else "exact, over their chunks only"
            lines.append(
                f"  user who may read 1 document ({reader['chunks']} chunks; {path}): recall@10 "
                f"{reader['recall_at_10']:.3f}, p50 {reader['p50_ms']:.1f} ms, p95 {reader['p95_ms']:.1f} ms"
            )
        if search.get("hybrid_p50_ms") is not None:
            lines.append(
                f"  hybrid search_passages (embed query + both arms + fetch): p50 {search['hybrid_p50_ms']:.1f} ms, "
                f"p95 {search['hybrid_p95_ms']:.1f} ms"
            )
        letters = search.get("letters")
        if letters:
            lines.append(
                f"  a letter's whole text searched ({letters['letters']} letters, {letters['searches']} searches): "
                f"p50 {letters['p50_ms']:.1f} ms, p95 {letters['p95_ms']:.1f} ms; with its terms counted one "
                f"by one in the full-text index (before): p50 {letters['counted_per_term_p50_ms']:.1f} ms, "
                f"p95 {letters['counted_per_term_p95_ms']:.1f} ms"
            )
            counts = letters["term_counts"]
            lines.append(
                f"  its terms' passage counts: stored p50 {counts['stored_p50_ms']:.1f} ms, p95 "
                f"{counts['stored_p95_ms']:.1f} ms; one count a term in the full-text index p50 "
                f"{counts['full_text_index_p50_ms']:.1f} ms, p95 {counts['full_text_index_p95_ms']:.1f} ms; "
                f"letters whose counts differ: {counts['disagreements']}"
            )
    return lines
