"""Pages -> chunks: passages for search, cut in tokens of the embedding model. Pure: no ORM, no I/O.

A chunk is a run of at most ``max_tokens`` tokens of the embedding model's own tokenizer
(all-MiniLM-L6-v2 reads at most 256 word pieces and silently drops the rest, so a chunk cut by
characters or words could lose its end). A chunk that has to be cut inside a sentence shares
``overlap_tokens`` tokens with the next, so that the cut sentence is whole in one of the two; one
that ends at a sentence, paragraph or page end shares nothing (no sentence is cut there, and
every token repeated is embedded, stored and searched again: about 10 % more work at the
default sizes when every cut overlapped). Chunks may run across pages;
each records the pages it covers and its place in the document's text, so that
``document_text[char_start:char_end] == text``.

The document's text is its pages joined by ``PAGE_SEPARATOR``; ``Page.char_start`` is the offset
of each page in it.

The tokenizer is anything callable as
``tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]``
giving ``(start, end)`` character offsets of each token in ``text``: a Hugging Face fast
tokenizer, or a fake one in tests.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

PAGE_SEPARATOR = "\n\n"
DEFAULT_MAX_TOKENS = 224
DEFAULT_OVERLAP_TOKENS = 24

_SENTENCE_ENDS = (".", "!", "?", ";", ":", '."', ".'", ".)", '?"', '!"')


class Tokenizer(Protocol):
    def __call__(self, text: str, *, add_special_tokens: bool = ..., return_offsets_mapping: bool = ...) -> Any: ...


class PageText(NamedTuple):
    number: int  # 1-based
    char_start: int  # offset of the page in the document's text
    text: str


@dataclass(frozen=True)
class ChunkSpan:
    index: int  # 0-based, in document order
    page_start: int
    page_end: int
    char_start: int  # in the document's text
    char_end: int
    text: str
    token_count: int


def pages_with_offsets(texts: Sequence[str], *, first_number: int = 1) -> list[PageText]:
    """Page texts in order -> pages with their offsets in the document's text."""
    pages, offset = [], 0
    for number, text in enumerate(texts, first_number):
        pages.append(PageText(number, offset, text))
        offset += len(text) + len(PAGE_SEPARATOR)
    return pages


def document_text(pages: Sequence[tuple[int, int, str]]) -> str:
    """The document's text, checking that every page sits at its ``char_start``."""
    text = PAGE_SEPARATOR.join(page_text for _, _, page_text in pages)
    expected = 0
    for number, char_start, page_text in pages:
        if char_start != expected:
            raise ValueError(
                f"page {number} starts at {char_start} but the pages joined by {PAGE_SEPARATOR!r} put it at {expected}"
            )
        expected += len(page_text) + len(PAGE_SEPARATOR)
    return text


class _Tokens:
    """Every token of the document: where it starts and ends in the document's text."""

    def __init__(self, text: str, pages: Sequence[tuple[int, int, str]], tokenizer: Tokenizer) -> None:
        self.text = text
        self.starts: list[int] = []
        self.ends: list[int] = []
        for _, char_start, page_text in pages:
            if not page_text.strip():
                continue
            encoding = tokenizer(page_text, add_special_tokens=False, return_offsets_mapping=True)
            for start, end in encoding["offset_mapping"]:
                if end > start:  # zero-width tokens mark nothing in the text
                    self.starts.append(char_start + start)
                    self.ends.append(char_start + end)

    def __len__(self) -> int:
        return len(self.starts)

    def word_boundary_before(self, i: int) -> bool:
        """Whether token i starts a new word (whitespace between, or punctuation on either side
        of the cut): a cut there leaves whole words on both sides, so each side tokenises on its own
        exactly as it did in place (word pieces of one word would not)."""
        start, previous_end = self.starts[i], self.ends[i - 1]
        # Characters between tokens that are not whitespace (zero-width, control) are dropped
        # by the tokenizer and do not separate words.
        if any(ch.isspace() for ch in self.text[previous_end:start]):
            return True
        return not (self.text[start].isalnum() and self.text[previous_end - 1].isalnum())


def chunk_pages(
    pages: Sequence[tuple[int, int, str]],
    tokenizer: Tokenizer,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
) -> list[ChunkSpan]:
    """Cut the document into chunks of at most ``max_tokens`` tokens, overlapping by about
    ``overlap_tokens`` where a cut falls inside a sentence. ``pages`` are
    ``(page_number, char_start, text)`` in order.

    Each page is tokenised once. A chunk that must end before the document does ends, if it can
    in its last quarter, after a paragraph or page, else after a sentence, else between words.
    Every character of the document other than whitespace lies in at least one chunk.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if not 0 <= overlap_tokens < max_tokens:
        raise ValueError("overlap_tokens must be at least 0 and less than max_tokens")
    text = document_text(pages)
    first_char = len(text) - len(text.lstrip())
    last_char = len(text.rstrip())
    if first_char >= last_char:
        return []
    page_starts = [char_start for _, char_start, _ in pages]
    page_numbers = [number for number, _, _ in pages]

    def page_at(offset: int) -> int:
        return page_numbers[bisect.bisect_right(page_starts, offset) - 1]

    tokens = _Tokens(text, pages, tokenizer)
    n = len(tokens)
    if n == 0:  # text, but nothing the tokenizer reads: keep it whole rather than lose it
        return [_span(0, text, first_char, last_char, 0, page_at)]

    spans: list[ChunkSpan] = []
    start = 0
    while True:
        end = min(start + max_tokens, n)
        clean = False
        if end < n:
            end, clean = _best_end(tokens, text, start, end, max_tokens, overlap_tokens)
        # Characters the tokenizer skips (control characters, say) between this chunk and the
        # next, or before the first token and after the last, go with the nearest chunk.
        char_start = first_char if start == 0 else tokens.starts[start]
        if end == n:
            char_end = last_char
        else:
            gap = text[tokens.ends[end - 1] : tokens.starts[end]]
            char_end = tokens.ends[end - 1] + len(gap.rstrip())
        spans.append(_span(len(spans), text, char_start, char_end, end - start, page_at))
        if end == n:
            return spans
        start = end if clean else _next_start(tokens, start, end, overlap_tokens)


def _best_end(
    tokens: _Tokens, text: str, start: int, end: int, max_tokens: int, overlap_tokens: int
) -> tuple[int, bool]:
    """The token index to end a full chunk before: the latest paragraph or page break in the
    chunk's last quarter, else the latest sentence end there, else the latest word boundary;
    and whether it is a clean end (a paragraph, page or sentence: no sentence cut)."""
    earliest = start + max(max_tokens - max_tokens // 4, overlap_tokens + 1, 1)
    best_sentence = best_word = None
    for i in range(end, earliest - 1, -1):
        if i <= start or not tokens.word_boundary_before(i):
            continue
        gap = text[tokens.ends[i - 1] : tokens.starts[i]]
        if "\n\n" in gap:  # a paragraph, or a page (pages are joined by a blank line)
            return i, True
        if best_sentence is None and text[tokens.starts[i - 1] : tokens.ends[i - 1]].endswith(_SENTENCE_ENDS):
            best_sentence = i
        if best_word is None:
            best_word = i
    if best_sentence is not None:
        return best_sentence, True
    if best_word is not None:
        return best_word, False
    # A very long word near the limit: end before it if the chunk keeps more than the overlap.
    for i in range(earliest - 1, start + overlap_tokens, -1):
        if tokens.word_boundary_before(i):
            return i, False
    return end, False  # one word longer than a chunk: cut it


def _next_start(tokens: _Tokens, start: int, end: int, overlap_tokens: int) -> int:
    """Where the chunk after [start, end) starts: ``overlap_tokens`` before ``end``, moved back
    to the start of its word (more overlap), or if that would not advance, forward to the next
    word (less overlap); mid-word only inside a word longer than the chunk."""
    wanted = max(end - overlap_tokens, start + 1)
    for i in range(wanted, start, -1):
        if tokens.word_boundary_before(i):
            return i
    for i in range(wanted + 1, end):
        if tokens.word_boundary_before(i):
            return i
    return wanted


RUNNING_HEADER_MIN_REPEATS = 3  # a title seen this often in one document is a page's header


def passage_headings(
    text: str,
    spans: Sequence[Any],
    *,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
) -> list[str | None]:
    """For each passage (a ``ChunkSpan`` or a stored ``Chunk``) of a document whose text is
    ``text``, the title of the section it starts in: the last clause title (``rerank.title_places``: "11.7 Assignment.", "ARTICLE ELEVEN
    APPLICABLE LAW", a line in capitals) that starts before it, or None: none before it, or the
    passage starts with its own title. Not titles here: a lettered item ("(a) The Supplier
    shall ...") and a title that recurs ``RUNNING_HEADER_MIN_REPEATS`` times or more (a page's
    running header, "CONFIDENTIAL", is no section's title). With ``count_tokens`` and
    ``max_tokens`` (what the embedder reads), a heading that would push the passage past it is
    left out: the passage's own end matters more than its title."""
    from documents.rerank import title_places

    places = [(start, title) for start, title in title_places(text) if text[start] != "("]
    repeats = Counter(title for _, title in places)
    places = [(start, title) for start, title in places if repeats[title] < RUNNING_HEADER_MIN_REPEATS]
    starts = [start for start, _ in places]
    headings: list[str | None] = []
    for span in spans:
        i = bisect.bisect_right(starts, span.char_start) - 1
        heading = places[i][1] if i >= 0 and starts[i] < span.char_start else None
        if heading and count_tokens and max_tokens and span.token_count + count_tokens(heading + "\n") > max_tokens:
            heading = None
        headings.append(heading)
    return headings


def embedding_text(text: str, heading: str | None) -> str:
    """What is embedded for a passage: its section's title on a line of its own, then the passage
    (the stored passage is its text alone). A clause cut into several passages is about what its
    title says in all of them, not only in the one that starts with the title."""
    return f"{heading}\n{text}" if heading else text


def _span(
    index: int, text: str, char_start: int, char_end: int, token_count: int, page_at: Callable[[int], int]
) -> ChunkSpan:
    return ChunkSpan(
        index=index,
        page_start=page_at(char_start),
        page_end=page_at(char_end - 1),
        char_start=char_start,
        char_end=char_end,
        text=text[char_start:char_end],
        token_count=token_count,
    )
