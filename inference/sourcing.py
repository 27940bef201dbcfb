"""Which page each statement of a summary comes from, decided by the appliance. Pure: passages
come in with their embeddings, sentences are embedded through a callable.

The model is asked to write page references like (p. 2), and a good model does; a small one
forgets or invents them. So every sentence of a summary is matched against the document's own
passages (the chunks search uses, embedded at ingestion): a page the model gave is kept when the
sentence is close to a passage of that page that also states its facts (``inference.facts``:
numbers, dates, names, negations), otherwise the closest such passage anywhere gives the page,
and a sentence no passage supports is marked as having none (with the facts it got wrong). Every statement then either
points at a page that says something like it, or says plainly that it does not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from inference.drafting import split_sentences, strip_item_marker
from inference.facts import missing_facts

SOURCE_MIN_SIMILARITY = 0.45  # cosine similarity of a sentence to a passage of its page
_REFERENCE = re.compile(r"\(\s*(?:pp?|pages?)\.?\s*(\d{1,5})(?:\s*[-\u2013]\s*(\d{1,5}))?\s*\)", re.IGNORECASE)


@dataclass(frozen=True)
class SourcePassage:
    page_start: int
    page_end: int
    vector: Sequence[float]  # unit length, as the embedder writes them
    text: str = ""  # for the facts check; a passage without text is held to similarity alone


@dataclass(frozen=True)
class Statement:
    text: str  # the sentence as the model wrote it
    page: int | None  # the page it comes from; None: no passage is close enough
    similarity: float | None  # to the closest passage of that page
    source: str  # "model": the model's own reference held; "matched": found by the appliance; "none"
    # Facts of the sentence that the closest passages do not state, when that is why no page
    # was given (a statement near a passage but with another number, date, name or negation).
    missing_facts: tuple[str, ...] = ()


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
    """The statement's words alone: without its page references, or the bullet of a list item."""
    return strip_item_marker(_REFERENCE.sub("", sentence).strip()).strip()


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
        plain = strip_references(sentence)
        claimed = model_pages(sentence, last_page)
        close = [i for i in np.argsort(-row) if row[i] >= min_similarity]
        # A passage gives the page only if it also states the sentence's facts.
        missing = {i: missing_facts(plain, [passages[i].text]) if passages[i].text else [] for i in close[:8]}
        holds = [i for i in close[:8] if not missing[i]]
        on_claimed = [i for i in holds if any(passages[i].page_start <= n <= passages[i].page_end for n in claimed)]
        if on_claimed:
            best = on_claimed[0]
            page = next(n for n in claimed if passages[best].page_start <= n <= passages[best].page_end)
            statements.append(Statement(sentence, page, round(float(row[best]), 3), "model"))
        elif holds:
            best = holds[0]
            statements.append(Statement(sentence, passages[best].page_start, round(float(row[best]), 3), "matched"))
        else:
            best = int(np.argmax(row))
            wrong = tuple(f.describe() for f in missing.get(best, []))
            statements.append(Statement(sentence, None, round(float(row[best]), 3), "none", wrong))
    return statements
