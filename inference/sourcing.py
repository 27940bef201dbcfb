"""Which page each statement of a summary comes from, decided by the appliance. Pure: passages
come in with their embeddings, sentences are embedded through a callable.

The model is asked to write page references like (p. 2), and a good model does; a small one
forgets or invents them. So every sentence of a summary is matched against the document's own
passages (the chunks search uses, embedded at ingestion): a page the model gave is kept when the
sentence is close to a passage of that page, otherwise the closest passage anywhere gives the
page, and a sentence close to no passage is marked as having none. Every statement then either
points at a page that says something like it, or says plainly that it does not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from inference.drafting import split_sentences

SOURCE_MIN_SIMILARITY = 0.45  # cosine similarity of a sentence to a passage of its page
_REFERENCE = re.compile(r"\(\s*(?:pp?|pages?)\.?\s*(\d{1,5})(?:\s*[-\u2013]\s*(\d{1,5}))?\s*\)", re.IGNORECASE)


@dataclass(frozen=True)
class SourcePassage:
    page_start: int
    page_end: int
    vector: Sequence[float]  # unit length, as the embedder writes them


@dataclass(frozen=True)
class Statement:
    text: str  # the sentence as the model wrote it
    page: int | None  # the page it comes from; None: no passage is close enough
    similarity: float | None  # to the closest passage of that page
    source: str  # "model": the model's own reference held; "matched": found by the appliance; "none"


def model_pages(sentence: str, last_page: int) -> list[int]:
    """The pages a sentence's own references name, within the document."""
    pages: list[int] = []
    for start, end in _REFERENCE.findall(sentence):
        first = int(start)
        last = int(end) if end else first
        for page in range(first, min(last, first + 20) + 1):
            if 1 <= page <= last_page and page not in pages:
                pages.append(page)
    return pages


def strip_references(sentence: str) -> str:
    return _REFERENCE.sub("", sentence).strip()


def source_statements(
    text: str,
    passages: Sequence[SourcePassage],
    *,
    last_page: int,
    embed: Callable[[list[str]], np.ndarray],
    min_similarity: float = SOURCE_MIN_SIMILARITY,
) -> list[Statement]:
    sentences = split_sentences(text)
    if not sentences:
        return []
    if not passages:
        return [Statement(s, None, None, "none") for s in sentences]
    vectors = np.asarray(embed([strip_references(s) for s in sentences]), dtype=np.float32)
    matrix = np.asarray([p.vector for p in passages], dtype=np.float32)
    similarities = vectors @ matrix.T  # unit vectors: cosine similarity
    statements = []
    for sentence, row in zip(sentences, similarities, strict=True):
        claimed = model_pages(sentence, last_page)
        on_claimed = [i for i, p in enumerate(passages) if any(p.page_start <= n <= p.page_end for n in claimed)]
        if on_claimed:
            best = max(on_claimed, key=lambda i: row[i])
            if row[best] >= min_similarity:
                page = next(n for n in claimed if passages[best].page_start <= n <= passages[best].page_end)
                statements.append(Statement(sentence, page, round(float(row[best]), 3), "model"))
                continue
        best = int(np.argmax(row))
        if row[best] >= min_similarity:
            statements.append(Statement(sentence, passages[best].page_start, round(float(row[best]), 3), "matched"))
        else:
            statements.append(Statement(sentence, None, round(float(row[best]), 3), "none"))
    return statements
