"""The evaluation's metrics, pure: clause precision / recall / F1 under CUAD's matching rule, the
evaluation's own judge of a draft sentence's support (lexical, not the product's check), and the
counts the other tasks report.

CUAD (Hendrycks et al., 2021) counts a predicted clause as correct when its words overlap a
labelled clause of the same category with a Jaccard similarity of at least 0.5; each labelled
clause can be matched once. Words here are lower-cased runs of letters and digits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

JACCARD_MATCH = 0.5

_WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def token_jaccard(a: str, b: str) -> float:
    left, right = words(a), words(b)
    if not left and not right:
        return 1.0
    return len(left & right) / len(left | right)


# --- support, judged by the evaluation itself ------------------------------------------------
#
# The product checks a draft sentence against what it cites by embeddings and by the facts it
# states (``inference.drafting``, ``inference.facts``); scoring drafts with that same check would
# grade the product by its own judgement. This judge is of another kind, lexical: a sentence is
# supported when every number it states is in the passages it cites and at least
# ``LEXICAL_SUPPORT_MIN`` of its content words are (words of four letters or more, function words
# aside, compared by their first six letters so that "terminate" meets "termination").

LEXICAL_SUPPORT_MIN = 0.6
_CITATION_MARK = re.compile(r"\[\s*\d+(?:\s*[,;]\s*\d+)*\s*\]")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_STOP = frozenset(
    """about above after again against also because been before being below between both could does doing
    down during each either even every from further have having here hers herself himself into itself just
    more most much must other ours ourselves over same shall should some such than that their theirs them
    themselves then there these they this those through under until very were what when where which while
    whom whose will with within without would your yours yourself dear thank thanks kind regards please
    sincerely""".split()  # noqa: SIM905 - a list of words reads better as words
)


def content_words(text: str) -> set[str]:
    return {w[:6] for w in _WORD.findall(text.lower()) if len(w) >= 4 and w.isalpha() and w not in _STOP}


def stated_numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in _NUMBER.findall(text)}


def lexically_supported(sentence: str, cited: Sequence[str], *, minimum: float = LEXICAL_SUPPORT_MIN) -> bool:
    """Whether the passages ``cited`` hold the sentence's numbers and enough of its words (its own
    citation marks aside). A sentence that cites nothing is not supported."""
    if not cited:
        return False
    claim = _CITATION_MARK.sub(" ", sentence)
    source = " ".join(cited)
    if stated_numbers(claim) - stated_numbers(source):
        return False
    wanted = content_words(claim)
    if not wanted:
        return True  # nothing to check beyond its numbers ("See [1].")
    return len(wanted & content_words(source)) / len(wanted) >= minimum


@dataclass(frozen=True)
class Span:
    category: str
    quote: str


@dataclass
class Counts:
    """True positives, predictions and labels, added up over documents."""

    matched: int = 0
    predicted: int = 0
    labelled: int = 0

    def add(self, other: Counts) -> None:
        self.matched += other.matched
        self.predicted += other.predicted
        self.labelled += other.labelled

    @property
    def precision(self) -> float | None:
        return self.matched / self.predicted if self.predicted else None

    @property
    def recall(self) -> float | None:
        return self.matched / self.labelled if self.labelled else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if p is None or r is None:
            return None
        return 2 * p * r / (p + r) if p + r else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "matched": self.matched,
            "predicted": self.predicted,
            "labelled": self.labelled,
            "precision": _round(self.precision),
            "recall": _round(self.recall),
            "f1": _round(self.f1),
        }


def match_clauses(predicted: Sequence[Span], labelled: Sequence[Span], *, threshold: float = JACCARD_MATCH) -> Counts:
    """One document: each prediction is matched to the unmatched label of its category it
    overlaps most, if that overlap reaches ``threshold``. Best pairs first, so that the result
    does not depend on the order of the predictions."""
    pairs = sorted(
        (
            (token_jaccard(p.quote, g.quote), i, j)
            for i, p in enumerate(predicted)
            for j, g in enumerate(labelled)
            if p.category == g.category
        ),
        key=lambda pair: (-pair[0], pair[1], pair[2]),
    )
    used_predictions: set[int] = set()
    used_labels: set[int] = set()
    for score, i, j in pairs:
        if score < threshold:
            break
        if i in used_predictions or j in used_labels:
            continue
        used_predictions.add(i)
        used_labels.add(j)
    return Counts(matched=len(used_labels), predicted=len(predicted), labelled=len(labelled))


def share(part: int, whole: int) -> float | None:
    return _round(part / whole) if whole else None


def mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return _round(sum(values) / len(values)) if values else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
