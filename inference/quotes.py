"""What a clause quote may be: the document's own sentences, rebuilt across line wraps, page
breaks and running headers and footers, and spans of a few of them. Pure: page texts in,
candidates out, each with where it is in the stored pages.

A PDF (and any hard-wrapped text) breaks lines inside sentences, and repeats a header, a footer
or a page number on every page. A quote cut at line breaks is a fragment no lawyer would mark.
So the pages are read as one stream of lines: lines that repeat at the top or bottom of many
pages, and bare page numbers, are left out; the rest are joined into paragraphs (a blank line,
a numbered clause, a heading or a short line that ends a sentence starts a new one); each
paragraph is cut into sentences by a segmenter that knows the abbreviations of contracts
("Inc.", "No. 5", "U.S.", "Sec. 2.1(a)"); and the candidates are each sentence, each numbered
sub-clause or semicolon part of one, runs of two and three consecutive sentences, and the whole
paragraph. Every candidate keeps the offsets of its first and last character in the stored
page texts, so the quote the model chooses is traced to the document without a search.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

MIN_WORDS = 4  # shorter pieces are headings, numbers and labels, not clauses
EDGE_LINES = 3  # lines at the top and at the bottom of a page where headers and footers sit
REPEATED_SHARE = 0.3  # a line seen at the edge of this share of the pages (and of 2+) is running text
MAX_SPAN_SENTENCES = 3
LIST_ITEMS = 4  # items of a list joined to the paragraph that leads into it

# Words that end in a full stop without ending a sentence (lower-case, without the stop).
ABBREVIATIONS = frozenset(
    [
        "inc",
        "corp",
        "co",
        "ltd",
        "llc",
        "l.l.c",
        "plc",
        "lp",
        "l.p",
        "llp",
        "n.a",
        "s.a",
        "n.v",
        "b.v",
        "ag",
        "gmbh",
        "pty",
        "pte",
        "bros",
        "assoc",
        "assn",
        "no",
        "nos",
        "sec",
        "secs",
        "art",
        "arts",
        "para",
        "paras",
        "cl",
        "ch",
        "pt",
        "sch",
        "sched",
        "ex",
        "exh",
        "exhs",
        "app",
        "fig",
        "p",
        "pp",
        "vol",
        "u.s",
        "u.s.a",
        "u.k",
        "e.u",
        "e.g",
        "i.e",
        "etc",
        "al",
        "cf",
        "viz",
        "vs",
        "v",
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "st",
        "jr",
        "sr",
        "hon",
        "messrs",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "approx",
        "est",
        "dept",
        "govt",
        "int'l",
        "intl",
        "natl",
        "mfg",
        "mgmt",
        "svcs",
    ]
)

_LINE = re.compile(r"[^\n]+")
_PAGE_NUMBER = re.compile(r"^[-\u2013\u2014\s]*(?:page\s*)?\d{1,4}(?:\s*(?:of|/)\s*\d{1,4})?[-\u2013\u2014\s]*$", re.I)
_ENUMERATOR = re.compile(
    r"^(?:\(?[a-z]{1,2}\)|\(?[ivxlc]{1,6}\)|\(?\d{1,3}[.)](?!\d)|\d{1,3}(?:\.\d{1,3})+\.?|"
    r"(?:section|article|schedule|exhibit|annex|clause)\s+[\divxlc]+|\u00a7|[\u2022\u25cf\u25aa\u2013\u2014*\-](?=\s))",
    re.I,
)
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(?=\s+[\"'\u201c\u2018(\[]?[A-Z0-9])")
_PART_BREAK = re.compile(r";(?:\s+(?:and|or))?(?=\s)|:(?=\s+\(?[a-z0-9ivx]{1,4}\)\s)")
_WORD_BEFORE = re.compile(r"([\w.'\u2019]+)$")
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Candidate:
    text: str  # the document's words, single-spaced: what the model may write
    page: int  # where its first character is
    start: int  # offset in that page's stored text
    end_page: int  # where its last character is (the same page, or a later one)
    end: int  # offset just past its last character in that page's stored text


@dataclass
class _Paragraph:
    chars: list[str]
    where: list[tuple[int, int]]  # (page, offset) of each character; (-1, -1) for a joining space


def _edge_key(line: str) -> str:
    return _WHITESPACE.sub(" ", re.sub(r"\d+", "#", line.strip().lower()))


def running_lines(pages: list[tuple[int, str]]) -> set[str]:
    """The keys (digits as #) of lines that repeat at the top or bottom of many pages."""
    if len(pages) < 2:
        return set()
    seen: Counter[str] = Counter()
    for _number, text in pages:
        lines = [m.group(0) for m in _LINE.finditer(text) if m.group(0).strip()]
        edges = lines[:EDGE_LINES] + lines[-EDGE_LINES:]
        seen.update({_edge_key(line) for line in edges})
    least = max(2, REPEATED_SHARE * len(pages))
    return {key for key, count in seen.items() if count >= least}


def _lines(pages: list[tuple[int, str]], running: set[str]) -> Iterator[tuple[int, int, int, str, bool]]:
    """(page, start, end, text, blank_before) of every line that is the document's own text."""
    for number, text in pages:
        matches = [m for m in _LINE.finditer(text) if m.group(0).strip()]
        previous_end = 0
        for index, match in enumerate(matches):
            line = match.group(0)
            at_edge = index < EDGE_LINES or index >= len(matches) - EDGE_LINES
            blank_before = text.count("\n", previous_end, match.start()) > 1
            previous_end = match.end()
            if at_edge and (_edge_key(line) in running or _PAGE_NUMBER.match(line)):
                continue
            left = len(line) - len(line.lstrip())
            yield number, match.start() + left, match.start() + len(line.rstrip()), line.strip(), blank_before


def _is_heading(line: str, full: int) -> bool:
    """A short line in capitals ("ARTICLE 5 TERMINATION"); a clause set in capitals runs to
    full lines, so those are not headings."""
    letters = [c for c in line if c.isalpha()]
    return (
        bool(letters)
        and len(line) < min(80, 0.7 * full)
        and all(c.isupper() for c in letters)
        and line[-1:] not in ",;"
    )


def paragraphs(pages: list[tuple[int, str]], running: set[str]) -> list[_Paragraph]:
    """The document's lines joined into paragraphs, across line wraps and page breaks, without
    the ``running`` lines (``running_lines``) at the pages' edges."""
    lines = list(_lines(pages, running))
    if not lines:
        return []
    widths = sorted(len(line[3]) for line in lines)
    full = widths[int(0.8 * (len(widths) - 1))]  # a full line of this document
    result: list[_Paragraph] = []
    current: _Paragraph | None = None
    previous = ""
    for number, start, _end, line, blank_before in lines:
        new = (
            current is None
            or blank_before
            or _ENUMERATOR.match(line) is not None
            or _is_heading(line, full)
            or _is_heading(previous, full)
            or (previous[-1:] in '.:;!?"\u201d' and len(previous) < 0.7 * full)
        )
        if current is None or new:
            current = _Paragraph([], [])
            result.append(current)
        elif previous.endswith("-") and len(previous) > 1 and previous[-2].isalpha() and line[:1].islower():
            current.chars.pop()  # "termi-" + "nation": one word
            current.where.pop()
        else:
            current.chars.append(" ")
            current.where.append((-1, -1))
        for offset, char in enumerate(line):
            current.chars.append(" " if char.isspace() else char)
            current.where.append((number, start + offset))
        previous = line
    return result


def _sentence_ends(text: str) -> list[int]:
    """Offsets just past each sentence's end (the last one is the text's end)."""
    ends = []
    for match in _SENTENCE_END.finditer(text):
        stop = match.start()
        if text[stop] == ".":
            word = _WORD_BEFORE.search(text[:stop])
            before = word.group(1).lower() if word else ""
            if before.rstrip(".") in ABBREVIATIONS or before in ABBREVIATIONS:
                continue
            if len(before) == 1 and before.isalpha():
                continue  # an initial: "J. Smith", "(a). "
        ends.append(match.end())
    if not ends or ends[-1] < len(text):
        ends.append(len(text))
    return ends


def _spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each candidate in a paragraph's text."""
    bounds = [0, *_sentence_ends(text)]
    sentences = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    spans: list[tuple[int, int]] = [(0, len(text))]
    for i in range(len(sentences)):
        for size in range(1, MAX_SPAN_SENTENCES + 1):
            if i + size <= len(sentences):
                spans.append((sentences[i][0], sentences[i + size - 1][1]))
    for start, end in sentences:
        cut = start
        for match in _PART_BREAK.finditer(text, start, end):
            spans.append((cut, match.end()))
            cut = match.end()
        if cut != start:
            spans.append((cut, end))
    return spans


def _with_lists(found: list[_Paragraph]) -> list[_Paragraph]:
    """The paragraphs, and besides each that leads into a list (it ends with a colon) that
    paragraph joined with the items that follow it: a clause and its numbered sub-clauses."""
    result: list[_Paragraph] = []
    for index, paragraph in enumerate(found):
        result.append(paragraph)
        if not "".join(paragraph.chars).rstrip().endswith(":"):
            continue
        joined = _Paragraph(list(paragraph.chars), list(paragraph.where))
        for item in found[index + 1 : index + 1 + LIST_ITEMS]:
            joined.chars.append(" ")
            joined.where.append((-1, -1))
            joined.chars += item.chars
            joined.where += item.where
        result.append(joined)
    return result


def quote_candidates(
    pages: list[tuple[int, str]], *, max_chars: int, running: set[str] | None = None
) -> list[Candidate]:
    """Every candidate quote of these pages (``(number, stored text)`` in order), longest-first
    within each paragraph, each place once; one longer than ``max_chars`` is cut at the last
    word boundary before it. ``running``: the running headers and footers, found over the whole
    document when these pages are only part of it (by default, over these pages)."""
    if running is None:
        running = running_lines(pages)
    found: dict[tuple[str, int, int], Candidate] = {}  # the same words in two places are two candidates
    for paragraph in _with_lists(paragraphs(pages, running)):
        text = "".join(paragraph.chars)
        for start, end in _spans(text):
            while start < end and text[start] == " ":
                start += 1
            while end > start and text[end - 1] == " ":
                end -= 1
            if end - start > max_chars:
                cut = text.rfind(" ", start, start + max_chars + 1)
                end = cut if cut > start else start + max_chars
            piece = text[start:end]
            first, last = paragraph.where[start], paragraph.where[end - 1]
            if len(piece.split()) < MIN_WORDS or (piece, *first) in found:
                continue
            found[(piece, *first)] = Candidate(piece, first[0], first[1], last[0], last[1] + 1)
    return list(found.values())
