"""Clause extraction: the taxonomy, the JSON schema the engine must follow, and quote
verification. Pure: no ORM, no engine.

A model can invent a quote. Every quote it returns is looked for in the stored text of the page
it names (then of the other pages it was shown): exactly, then with whitespace, quotes and
hyphenation normalised, then as a close match of the same words. A quote found nowhere is
dropped and counted; one found is returned with the exact span of the page text it matched, so
the UI highlights what the document says, not what the model wrote.
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from inference.quotes import Candidate, quote_candidates

# The 41 categories of CUAD (Hendrycks et al., 2021, CC BY 4.0), then five that offices ask for.
CUAD_CATEGORIES = (
    "Document Name", "Parties", "Agreement Date", "Effective Date", "Expiration Date", "Renewal Term",
    "Notice Period To Terminate Renewal", "Governing Law", "Most Favored Nation", "Non-Compete", "Exclusivity",
    "No-Solicit Of Customers", "Competitive Restriction Exception", "No-Solicit Of Employees", "Non-Disparagement",
    "Termination For Convenience", "Rofr/Rofo/Rofn", "Change Of Control", "Anti-Assignment",
    "Revenue/Profit Sharing", "Price Restrictions", "Minimum Commitment", "Volume Restriction",
    "Ip Ownership Assignment", "Joint Ip Ownership", "License Grant", "Non-Transferable License",
    "Affiliate License-Licensor", "Affiliate License-Licensee", "Unlimited/All-You-Can-Eat-License",
    "Irrevocable Or Perpetual License", "Source Code Escrow", "Post-Termination Services", "Audit Rights",
    "Uncapped Liability", "Cap On Liability", "Liquidated Damages", "Warranty Duration", "Insurance",
    "Covenant Not To Sue", "Third Party Beneficiary",
)  # fmt: skip
OFFICE_CATEGORIES = ("Confidentiality", "Payment Terms", "Termination", "Indemnification", "Limitation Of Liability")

TAXONOMIES: dict[str, tuple[str, ...]] = {
    "cuad": CUAD_CATEGORIES + OFFICE_CATEGORIES,
    "office": OFFICE_CATEGORIES,
}
DEFAULT_TAXONOMY: Final = "office"

FUZZY_MIN_RATIO = 0.9
# Bounds that keep a whole answer inside the request's token limit, whatever the model does
# (a small model can repeat one string until it runs out of tokens).
QUOTE_MAX_CHARS = 400
NOTE_MAX_CHARS = 200
ITEMS_PER_CATEGORY = 2
MAX_ITEMS = 20
# Quotes are chosen from the section's own sentences when there are at most this many: guided
# decoding then cannot write a sentence the document does not have. Past it, the grammar would
# grow large, and the quote is free text again (and verified all the same).
MAX_QUOTE_CHOICES = 800


def categories_for(taxonomy: str, selected: list[str] | None = None) -> tuple[str, ...]:
    """The categories a job asks for: a named taxonomy, optionally narrowed to some of it."""
    if taxonomy not in TAXONOMIES:
        raise ValueError(f"unknown taxonomy {taxonomy!r}; choose one of {', '.join(TAXONOMIES)}")
    allowed = TAXONOMIES[taxonomy]
    if not selected:
        return allowed
    unknown = [c for c in selected if c not in allowed]
    if unknown:
        raise ValueError(f"not in the {taxonomy} taxonomy: {', '.join(unknown)}")
    return tuple(c for c in allowed if c in selected)


def quote_choices(pages: list[tuple[int, str]], running: set[str] | None = None) -> list[Candidate]:
    """What a quote may be (``clause_schema``): the pages' sentences rebuilt across line wraps,
    page breaks and running headers (``running``: see ``inference.quotes.running_lines``),
    numbered sub-clauses and runs of a few sentences, each at most ``QUOTE_MAX_CHARS`` and
    located in the pages' text."""
    return quote_candidates(pages, max_chars=QUOTE_MAX_CHARS, running=running)


def clause_schema(categories: tuple[str, ...], pages: list[int], quotes: list[str] | None = None) -> dict[str, Any]:
    """The JSON schema the engine's guided decoding holds the model to. With ``quotes`` (see
    ``quote_choices``) a quote must be one of them, word for word."""
    if quotes and len(quotes) <= MAX_QUOTE_CHOICES:
        quote: dict[str, Any] = {"type": "string", "enum": list(quotes)}
    else:
        quote = {"type": "string", "minLength": 1, "maxLength": QUOTE_MAX_CHARS}
    return {
        "type": "object",
        "properties": {
            "clauses": {
                "type": "array",
                "maxItems": min(MAX_ITEMS, ITEMS_PER_CATEGORY * len(categories)),
                "items": {
                    "type": "object",
                    "properties": {
                        "category": {"type": "string", "enum": list(categories)},
                        "quote": quote,
                        "page": {"type": "integer", "enum": list(pages)},
                        "note": {"type": "string", "maxLength": NOTE_MAX_CHARS},
                    },
                    "required": ["category", "quote", "page", "note"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["clauses"],
        "additionalProperties": False,
    }


def parse_answer(text: str) -> tuple[list[dict[str, Any]], bool]:
    """The clause objects of an answer, and whether it was complete. An answer cut off by its
    token limit still yields the objects it finished."""
    try:
        found = json.loads(text)["clauses"]
        if isinstance(found, list):
            return [item for item in found if isinstance(item, dict)], True
    except (ValueError, KeyError, TypeError):
        pass
    start = text.find("[")
    if start < 0:
        return [], False
    decoder = json.JSONDecoder()
    items: list[dict[str, Any]] = []
    position = start + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        try:
            item, position = decoder.raw_decode(text, position)
        except ValueError:
            return items, False
        if isinstance(item, dict):
            items.append(item)


@dataclass(frozen=True)
class Match:
    page: int
    start: int  # character offsets in that page's stored text
    end: int
    how: str  # "exact", "normalised", "fuzzy" or "candidate" (one of the quotes offered, located)
    ratio: float = 1.0
    end_page: int | None = None  # where it ends, when on a later page than it starts


_QUOTES = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-", "\u00a0": " "}
)


def _normalise_with_map(text: str) -> tuple[str, list[int]]:
    """Lower-cased text with quotes, dashes and runs of whitespace unified and words broken by
    a hyphen at a line end joined, plus each output character's offset in ``text``."""
    out: list[str] = []
    offsets: list[int] = []
    i = 0
    text = unicodedata.normalize("NFC", text)
    while i < len(text):
        char = text[i].translate(_QUOTES)
        if char == "-" and i + 1 < len(text) and text[i + 1] == "\n" and out and out[-1].isalpha():
            i += 2  # "termi-\nnation" -> "termination"
            while i < len(text) and text[i] in " \t":
                i += 1
            continue
        if char.isspace():
            if out and out[-1] != " ":
                out.append(" ")
                offsets.append(i)
            i += 1
            continue
        out.append(char.lower())
        offsets.append(i)
        i += 1
    while out and out[-1] == " ":
        out.pop()
        offsets.pop()
    return "".join(out), offsets


def _normalise(text: str) -> str:
    return _normalise_with_map(text)[0].strip()


def _find_in_page(quote: str, page_text: str) -> Match | None:
    start = page_text.find(quote)
    if start >= 0:
        return Match(0, start, start + len(quote), "exact")
    needle = _normalise(quote)
    if not needle:
        return None
    haystack, offsets = _normalise_with_map(page_text)
    start = haystack.find(needle)
    if start >= 0:
        end = start + len(needle) - 1
        return Match(0, offsets[start], offsets[end] + 1, "normalised")
    return _fuzzy(needle, haystack, offsets)


_WORD = re.compile(r"\S+")


def _fuzzy(needle: str, haystack: str, offsets: list[int]) -> Match | None:
    """The window of the page's words most like the quote's, if at least ``FUZZY_MIN_RATIO``."""
    quote_words = needle.split()
    spans = [(m.start(), m.end()) for m in _WORD.finditer(haystack)]
    words = [haystack[a:b] for a, b in spans]
    n = len(quote_words)
    if n < 4 or not words:
        return None  # too short to tell a near miss from a different phrase
    best: tuple[float, int, int] | None = None
    first_words = {w for w in quote_words[:3]}
    for size in sorted({max(1, n - n // 10), n, n + n // 10}):
        for i in range(0, max(1, len(words) - size + 1)):
            if words[i] not in first_words and i + 1 < len(words) and words[i + 1] not in first_words:
                continue  # cheap pre-filter: a match starts near one of the quote's first words
            ratio = difflib.SequenceMatcher(None, quote_words, words[i : i + size], autojunk=False).ratio()
            if best is None or ratio > best[0]:
                best = (ratio, i, i + size)
    if best is None or best[0] < FUZZY_MIN_RATIO:
        return None
    ratio, i, j = best
    start, end = spans[i][0], spans[min(j, len(spans)) - 1][1] - 1
    return Match(0, offsets[start], offsets[end] + 1, "fuzzy", round(ratio, 3))


def verify_quote(quote: str, page: int, pages: dict[int, str]) -> Match | None:
    """Where ``quote`` is in the stored text: on ``page`` first, then on the other pages given.
    None when it is in none of them (the model made it up or rewrote it beyond recognition)."""
    quote = quote.strip()
    if not quote:
        return None
    order = [page] + [p for p in pages if p != page] if page in pages else list(pages)
    for number in order:
        found = _find_in_page(quote, pages[number])
        if found is not None:
            return Match(number, found.start, found.end, found.how, found.ratio)
    return None


@dataclass(frozen=True)
class Clause:
    category: str
    quote: str  # the page's own text of the match, not the model's wording
    page: int
    start: int
    end: int
    note: str
    match: str
    end_page: int  # the page its last character is on: ``page``, or a later one


@dataclass(frozen=True)
class Verified:
    clauses: list[Clause]
    dropped: list[dict[str, Any]]  # what the model claimed and the text does not contain


def verify_clauses(
    raw: list[dict[str, Any]], pages: dict[int, str], categories: tuple[str, ...], offered: Sequence[Candidate] = ()
) -> Verified:
    """The claimed clauses whose quote is in the text. A quote that is one of the candidates
    ``offered`` to the model (``quote_choices``) is where that candidate is, across line and
    page breaks; any other is looked for (``verify_quote``)."""
    located: dict[str, list[Candidate]] = {}
    for offer in offered:  # the same words can be in two places (a clause repeated)
        located.setdefault(offer.text, []).append(offer)
    kept: list[Clause] = []
    dropped: list[dict[str, Any]] = []
    seen: set[tuple[str, int, int]] = set()
    for item in raw:
        category, quote = str(item.get("category", "")), str(item.get("quote", ""))
        try:
            page = int(item.get("page", 0))
        except (TypeError, ValueError):
            page = 0
        match = None
        if category in categories:
            places = located.get(quote.strip(), [])
            # Where the model said it is, if the words are there too; else their first place.
            candidate = next((c for c in places if c.page == page), places[0] if places else None)
            if candidate is not None and candidate.page in pages and candidate.end_page in pages:
                match = Match(candidate.page, candidate.start, candidate.end, "candidate", end_page=candidate.end_page)
            else:
                match = verify_quote(quote, page, pages)
        if match is None:
            dropped.append({"category": category, "quote": quote[:QUOTE_MAX_CHARS], "page": page})
            continue
        key = (category, match.page, match.start)
        if key in seen:
            continue  # the same clause found twice (overlapping sections)
        seen.add(key)
        # The document's own words: the candidate's (single-spaced, without the running headers
        # it crosses), else the stored text of the match.
        text = quote.strip() if match.how == "candidate" else pages[match.page][match.start : match.end]
        kept.append(
            Clause(
                category,
                text,
                match.page,
                match.start,
                match.end,
                str(item.get("note", ""))[:NOTE_MAX_CHARS],
                match.how,
                match.end_page or match.page,
            )
        )
    return Verified(kept, dropped)
