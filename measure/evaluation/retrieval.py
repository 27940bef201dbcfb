"""Retrieval, measured: does search put the passage that answers a question among the six a draft
is given (``drafting.DRAFT_PASSAGES``)? Pure: texts and character ranges in, figures out.

Two sets of questions, neither written by looking at what search returns:

- the reply gold set: each request's expected passages (gold snippets, verbatim in their
  documents), searched over every document the author may read, as a draft is;
- labelled contracts (``../shared/data/cuad-dev``): one question per labelled category, written
  from CUAD's own category descriptions (``data/cuad_questions.json``), searched in that contract
  alone, as someone asking about the contract they have open; the target is the lawyers'
  labelled span.

A target is found when one of the first ``k`` passages covers at least half of it, or it covers
at least half of the passage (a labelled clause longer than a passage). Targets are located in
the document's stored text by their words (``locate``): CUAD quotes its spans with other
whitespace and line breaks than a PDF's extraction, so an exact ``str.find`` would miss most.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUESTIONS_FILE = Path(__file__).parent / "data" / "cuad_questions.json"
RECALL_AT = (1, 3, 6)
ANCHOR_WORDS = 6  # words at each end of a span that must appear in order, to place it

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Target:
    start: int  # character range in the document's stored text
    end: int


def load_questions(path: Path = QUESTIONS_FILE) -> dict[str, str]:
    """Category -> the question a person would ask about it."""
    data = json.loads(path.read_text(encoding="utf-8"))
    questions = data["questions"]
    if not isinstance(questions, dict) or not all(isinstance(v, str) and v for v in questions.values()):
        raise ValueError(f"{path}: 'questions' must map each category to a question")
    return questions


def _words_with_offsets(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    words, places = [], []
    for match in _WORD.finditer(text.lower()):
        words.append(match.group(0))
        places.append((match.start(), match.end()))
    return words, places


def _find_run(haystack: list[str], needle: list[str], start: int = 0) -> list[int]:
    """Every index at or after ``start`` where ``needle`` occurs in ``haystack`` as a run."""
    if not needle:
        return []
    found, first, n = [], needle[0], len(needle)
    for i in range(start, len(haystack) - n + 1):
        if haystack[i] == first and haystack[i : i + n] == needle:
            found.append(i)
    return found


class Locator:
    """Places spans in one document's text by their words (whitespace and punctuation aside)."""

    def __init__(self, text: str) -> None:
        self.words, self.places = _words_with_offsets(text)

    def locate(self, span: str) -> Target | None:
        """The span's character range, or None when its words are not in the text in order:
        the whole run of its words if it is there, else its first and last ``ANCHOR_WORDS``
        words about as far apart as the span is long, else one of the two if it occurs once
        (extraction broke a word at the other end), the span's length from it."""
        mine = _WORD.findall(span.lower())
        if not mine:
            return None
        whole = _find_run(self.words, mine)
        if whole:
            return self._target(whole[0], whole[0] + len(mine) - 1)
        k = min(ANCHOR_WORDS, len(mine))
        heads, tails = _find_run(self.words, mine[:k]), _find_run(self.words, mine[-k:])
        best = None
        for head in heads:
            for tail in tails:
                length = tail + k - head
                if 0.5 * len(mine) <= length <= 2 * len(mine) + 10:
                    gap = abs(length - len(mine))
                    if best is None or gap < best[0]:
                        best = (gap, head, tail + k - 1)
        if best is not None:
            return self._target(best[1], best[2])
        if len(heads) == 1 and not tails:  # one end only, and only once: as long as the span
            return self._target(heads[0], min(heads[0] + len(mine), len(self.words)) - 1)
        if len(tails) == 1 and not heads:
            return self._target(max(tails[0] + k - len(mine), 0), tails[0] + k - 1)
        return None

    def _target(self, first_word: int, last_word: int) -> Target:
        return Target(self.places[first_word][0], self.places[last_word][1])


def covers(passage: tuple[int, int], target: Target) -> bool:
    """A passage holds a target when they share at least half of the shorter of the two."""
    overlap = min(passage[1], target.end) - max(passage[0], target.start)
    shorter = min(passage[1] - passage[0], target.end - target.start)
    return shorter > 0 and overlap >= 0.5 * shorter


def first_rank(passages: Sequence[tuple[int, int, int]], document_id: int, targets: Sequence[Target]) -> int | None:
    """The 1-based rank of the first passage (document id, start, end) that holds any target of
    that document, or None when none does."""
    for rank, (passage_document, start, end) in enumerate(passages, 1):
        if passage_document == document_id and any(covers((start, end), t) for t in targets):
            return rank
    return None


def recall_figures(ranks: Sequence[int | None]) -> dict[str, Any]:
    """Recall at each of ``RECALL_AT`` and the mean reciprocal rank, over questions."""
    n = len(ranks)
    out: dict[str, Any] = {"questions": n}
    for k in RECALL_AT:
        out[f"recall@{k}"] = round(sum(r is not None and r <= k for r in ranks) / n, 3) if n else None
    out["mrr"] = round(sum(1 / r for r in ranks if r is not None) / n, 3) if n else None
    return out
