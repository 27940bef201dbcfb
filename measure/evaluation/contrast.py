"""A contrast set for the support checks, built at run time from passages no one here wrote
for it (the gold set's cited snippets and labelled clauses, CUAD-dev's labelled spans): each
sentence of a passage as it is, and altered the ways a model gets a fact wrong while staying
close in words (a number, a month, a party swapped; a negation added or removed). The label of
each case is known by construction, so the checks are scored against it, not against each other.
Pure: passages and a seeded random generator in, cases out; AUROC by ranks.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from inference.drafting import split_sentences
from inference.facts import facts_of

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")  # fmt: skip
OTHER_PARTIES = ("Northwind Trading Ltd", "Harbour Logistics Inc.", "Meridian Holdings LLC", "Castlegate plc")
_NUMBER = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?![\w])")
_NUMBER_WORD = re.compile(
    r"\b(one|two|three|four|five|six|seven|eight|nine|ten|twelve|fifteen|twenty|thirty|forty|fifty|sixty|ninety)\b",
    re.IGNORECASE,
)
_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve", "fifteen", "twenty",
          "thirty", "forty", "fifty", "sixty", "ninety")  # fmt: skip
_MODAL_NOT = re.compile(r"\b(shall|will|may|must|can|does|do|is|are|has|have)\s+not\b", re.IGNORECASE)
_NO = re.compile(r"\b(no|never)\s+(?=\w)", re.IGNORECASE)
_MODAL = re.compile(r"\b(shall|will|may|must|is|are)\b(?!\s+not\b)")
MIN_WORDS = 6


@dataclass(frozen=True)
class ContrastCase:
    sentence: str
    passage: str
    change: str  # "none", or what was altered: "number", "month", "party", "negation added", "negation removed"

    @property
    def changed(self) -> bool:
        return self.change != "none"


def _swap_number(sentence: str, rng: random.Random) -> str | None:
    digits = list(_NUMBER.finditer(sentence))
    if digits:
        match = rng.choice(digits)
        value = match.group(1).replace(",", "")
        number = float(value)
        other = number + rng.choice([1, 2, 3, 5, 10]) if number < 100 else number * rng.choice([2, 3]) + 1
        text = f"{other:,.0f}" if "," in match.group(1) else (f"{other:g}" if "." in value else str(int(other)))
        return sentence[: match.start(1)] + text + sentence[match.end(1) :]
    words = list(_NUMBER_WORD.finditer(sentence))
    if words:
        match = rng.choice(words)
        others = [w for w in _WORDS if w != match.group(1).lower()]
        word = rng.choice(others)
        word = word.capitalize() if match.group(1)[0].isupper() else word
        return sentence[: match.start(1)] + word + sentence[match.end(1) :]
    return None


def _swap_month(sentence: str, rng: random.Random) -> str | None:
    found = [m for m in MONTHS if re.search(rf"\b{m}\b", sentence)]
    if not found:
        return None
    month = rng.choice(found)
    other = rng.choice([m for m in MONTHS if m != month])
    return re.sub(rf"\b{month}\b", other, sentence, count=1)


def _swap_party(sentence: str, rng: random.Random, names: Sequence[str]) -> str | None:
    mine = [f.text for f in facts_of(sentence) if f.kind == "name" and len(f.text) > 2 and f.text in sentence]
    if not mine:
        return None
    name = rng.choice(mine)
    others = [n for n in names if n.lower() != name.lower() and n.lower() not in sentence.lower()]
    if not others:
        return None
    return sentence.replace(name, rng.choice(others), 1)


def _flip_negation(sentence: str) -> tuple[str, str] | None:
    match = _MODAL_NOT.search(sentence)
    if match:
        return sentence[: match.start()] + match.group(1) + sentence[match.end() :], "negation removed"
    match = _NO.search(sentence)
    if match and match.group(1).lower() == "never":
        return sentence[: match.start()] + sentence[match.end() :], "negation removed"
    match = _MODAL.search(sentence)
    if match:
        return sentence[: match.end()] + " not" + sentence[match.end() :], "negation added"
    return None


def build_contrast_set(
    passages: Sequence[str], *, seed: int, names: Sequence[str] = OTHER_PARTIES
) -> list[ContrastCase]:
    """For every sentence of the passages with a fact to alter: the sentence unchanged, and one
    case for each alteration that applies to it, each checked against its whole passage."""
    rng = random.Random(seed)  # noqa: S311 - a sample, not a secret
    cases: list[ContrastCase] = []
    seen: set[str] = set()
    for passage in passages:
        passage = " ".join(passage.split())
        for sentence in split_sentences(passage):
            if len(sentence.split()) < MIN_WORDS or sentence in seen:
                continue
            seen.add(sentence)
            altered: list[tuple[str | None, str]] = [
                (_swap_number(sentence, rng), "number"),
                (_swap_month(sentence, rng), "month"),
                (_swap_party(sentence, rng, names), "party"),
            ]
            flipped = _flip_negation(sentence)
            if flipped:
                altered.append(flipped)
            changes = [(text, change) for text, change in altered if text and text != sentence]
            if not changes:
                continue
            cases.append(ContrastCase(sentence, passage, "none"))
            cases += [ContrastCase(text, passage, change) for text, change in changes]
    return cases


def auroc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """The probability that a random positive case scores above a random negative one (ties
    count half): the area under the ROC curve, by ranks."""
    pairs = sorted(zip(scores, positive, strict=True))
    n_pos = sum(positive)
    n_neg = len(pairs) - n_pos
    if not n_pos or not n_neg:
        return None
    rank_sum = 0.0
    i = 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        average_rank = (i + 1 + j) / 2  # ranks i+1..j share their mean
        rank_sum += average_rank * sum(1 for k in range(i, j) if pairs[k][1])
        i = j
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
