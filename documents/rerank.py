"""Reranking search's candidates by what a reader looks at first: the section they are in. Pure.

The two arms of search (``documents.search``) find passages by meaning and by words; fused, the
passage that answers a question is often among the candidates but not among the first six a
draft is given, because a contract's clauses share most of their words ("this Agreement", "the
Party", "written notice") and the passage about *assignment* reads much like its neighbours.
What tells them apart for a person is the clause's title ("11.7 Assignment.", "ARTICLE ELEVEN
APPLICABLE LAW"). The reranker fuses three orders of the candidates, by reciprocal rank:

- the arms' fused order, counted twice (it is two arms already);
- the clause titles of the passage (those in it, and the one it starts under, read from the
  passage before it) ranked by how many of the question's terms they hold;
- the passage ranked by how many of the question's terms it holds (its *coverage*), titles
  included.

Terms are compared by a truncation stem (the first six letters of a long word, "terminate" and
"termination" alike; a plural's "s" dropped), which is crude and language-free; no weight was
fitted to any evaluation set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

RRF_K = 60
FUSED_WEIGHT = 2.0  # the arms' fused order stands for two rankings
STEM_CHARS = 6
TITLE_MAX_WORDS = 8

_WORD = re.compile(r"[A-Za-z][A-Za-z']+|\d+")
# A numbered clause's title: "5.5 Audit Right.", "Section 11. Assignment:", "(c) Notices." or
# "ARTICLE ELEVEN APPLICABLE LAW; DISPUTE RESOLUTION" (a title in capitals after an article).
_NUMBERED_TITLE = re.compile(
    r"(?:^|(?<=\s))(?:(?:Section|SECTION|Article|Clause)\s+)?(?:\d{1,3}(?:\.\d{1,3}){0,3}\.?|\([a-z]{1,3}\))\s+"
    r"(?P<title>[A-Z][A-Za-z'\u2019/&,\- ]{1,80}?)[.:](?=\s|$)"
)
_ARTICLE_TITLE = re.compile(
    r"(?:ARTICLE|SECTION)\s+(?:[0-9IVXLC]+|[A-Z]+(?:-[A-Z]+)?)\.?\s+(?P<title>[A-Z][A-Z'/&,;\- ]{2,80}?)(?=\s+\d|\s{2,}|$)"
)
# Spaces and tabs only around it (not \s, which takes line ends: its match would start at the
# blank line before the title, and a long run of blank lines would cost quadratic time).
_CAPITALS_LINE = re.compile(
    r"^[ \t]*(?:\d{1,3}(?:\.\d{1,3})*\.?[ \t]+)?(?P<title>[A-Z][A-Z'/&,\- ]{3,60}?)\.?[ \t]*$", re.M
)


def stem(word: str) -> str:
    word = word.lower().replace("\u2019", "'")
    if word.endswith("'s"):
        word = word[:-2]
    word = word.strip("'")
    if len(word) > STEM_CHARS:
        return word[:STEM_CHARS]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def stems(text: str) -> set[str]:
    return {stem(w) for w in _WORD.findall(text)}


def titles(text: str) -> list[str]:
    """The clause titles in ``text``, in order: numbered ones, article titles in capitals, and
    lines in capitals of their own."""
    return [title for _, title in title_places(text)]


def title_places(text: str) -> list[tuple[int, str]]:
    """``titles`` with where each starts in ``text`` (its number, if it has one), in order."""
    found: list[tuple[int, str]] = []
    for pattern in (_NUMBERED_TITLE, _ARTICLE_TITLE, _CAPITALS_LINE):
        for match in pattern.finditer(text):
            title = " ".join(match.group("title").split()).strip(" ,;-")
            if title and len(title.split()) <= TITLE_MAX_WORDS:
                found.append((match.start(), title))
    return sorted(found)


@dataclass(frozen=True)
class Candidate:
    chunk_id: int
    text: str
    before: str = ""  # the text just before the passage (the passage before it), for its title


def rerank(terms: Sequence[str], candidates: Sequence[Candidate]) -> list[int]:
    """Chunk ids of ``candidates`` (in the arms' fused order, best first) in reranked order.
    ``terms``: the question's significant terms (``search.significant_terms``)."""
    wanted = {stem(t) for t in terms} - {""}
    if not candidates or not wanted:
        return [c.chunk_id for c in candidates]
    heading_hits, coverage = {}, {}
    for candidate in candidates:
        own = titles(candidate.text)
        earlier = titles(candidate.before)
        heading = set().union(*(stems(t) for t in own + earlier[-1:])) if own or earlier else set()
        heading_hits[candidate.chunk_id] = len(wanted & heading)
        coverage[candidate.chunk_id] = len(wanted & (stems(candidate.text) | heading))
    order = {c.chunk_id: rank for rank, c in enumerate(candidates, 1)}
    scores = {chunk_id: FUSED_WEIGHT / (RRF_K + rank) for chunk_id, rank in order.items()}
    for counts in (heading_hits, coverage):
        ranked = sorted((cid for cid in counts if counts[cid] > 0), key=lambda cid: (-counts[cid], order[cid]))
        for rank, chunk_id in enumerate(ranked, 1):
            scores[chunk_id] += 1.0 / (RRF_K + rank)
    return sorted(scores, key=lambda cid: (-scores[cid], order[cid]))
