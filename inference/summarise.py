"""Cut a document into sections that fit the model's context, for map-reduce. Pure.

Every document task (summary, clause extraction) cuts a document the same way: the sections
depend only on the pages, the title and the context length, never on the task. A section's
prompt puts the section's text first and the task's instruction last, so a second task on the
same document finds each section's prefix in the engine's prefix cache.

A summary of a document that fits in one section is one request. A longer one is summarised
section by section ("map"), each partial citing its pages, then the partials are combined
("reduce"), in groups if they do not fit together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from inference.prompts import PageText, render_document, section_messages

T = TypeVar("T")  # a partial summary: its text, or its text with the pages it covers

Messages = list[dict[str, str]]
CountMany = Callable[[list[Messages]], list[int]]

# Room kept in every section's prompt for the longest task instruction and answer. The same for
# every task, so that all tasks cut a document into the same sections.
SECTION_RESERVE_TOKENS = 1536


@dataclass(frozen=True)
class Section:
    index: int  # 0-based
    pages: tuple[PageText, ...]  # a long page may be cut into pieces that keep its number

    @property
    def first_page(self) -> int:
        return self.pages[0].number

    @property
    def last_page(self) -> int:
        return self.pages[-1].number

    @property
    def page_label(self) -> str:
        return (
            f"page {self.first_page}"
            if self.first_page == self.last_page
            else f"pages {self.first_page}-{self.last_page}"
        )


def section_budget_tokens(context_tokens: int) -> int:
    budget = context_tokens - SECTION_RESERVE_TOKENS
    if budget < 256:
        raise ValueError(f"the model's context ({context_tokens} tokens) is too small for document tasks")
    return budget


def split_sections(*, title: str, pages: list[PageText], context_tokens: int, count_many: CountMany) -> list[Section]:
    """Sections of whole pages (a page longer than a section is cut into pieces), each whose
    document part fits ``context - SECTION_RESERVE_TOKENS``. Every page's text is in exactly one
    section, in order. ``count_many`` counts the tokens of several prompts in one call."""
    if not pages:
        raise ValueError("a document with no pages has nothing to read")
    budget = section_budget_tokens(context_tokens)
    base = count_many([section_messages(title=title, pages=[], instruction="")])[0]
    room = budget - base
    pieces, costs = _fit_pages(pages, room, count_many)
    sections: list[list[PageText]] = []
    current: list[PageText] = []
    used = 0
    for piece, cost in zip(pieces, costs, strict=True):
        if current and used + cost > room:
            sections.append(current)
            current, used = [], 0
        current.append(piece)
        used += cost
    if current:
        sections.append(current)
    # Tokenisers do not add up exactly across joins: count every section whole (one call), and
    # move the last piece of one that is over on to the next until it fits.
    totals = count_many([section_messages(title=title, pages=s, instruction="") for s in sections])
    result: list[list[PageText]] = []
    index = 0
    while index < len(sections):
        section, total = sections[index], totals[index]
        while len(section) > 1 and total > budget:
            moved = section.pop()
            if index + 1 == len(sections):
                sections.append([])
                totals.append(0)
            sections[index + 1].insert(0, moved)
            totals[index + 1] = budget + 1  # changed: count it again when its turn comes
            total = count_many([section_messages(title=title, pages=section, instruction="")])[0]
        if index + 1 < len(sections) and totals[index + 1] > budget:
            totals[index + 1] = count_many([section_messages(title=title, pages=sections[index + 1], instruction="")])[
                0
            ]
        result.append(section)
        index += 1
    return [Section(i, tuple(s)) for i, s in enumerate(result)]


def _page_costs(pages: list[PageText], count_many: CountMany) -> list[int]:
    empty = count_many([[{"role": "user", "content": ""}]])[0]
    counts = count_many([[{"role": "user", "content": render_document("", [p])}] for p in pages])
    wrapper = count_many([[{"role": "user", "content": render_document("", [])}]])[0] - empty
    return [max(1, c - empty - wrapper) for c in counts]


def _fit_pages(pages: list[PageText], room: int, count_many: CountMany) -> tuple[list[PageText], list[int]]:
    """Pages and their token costs, with any page longer than ``room`` cut at paragraph, line or
    sentence ends (or, failing those, between words) into pieces that fit."""
    costs = _page_costs(pages, count_many)
    out: list[PageText] = []
    out_costs: list[int] = []
    for page, cost in zip(pages, costs, strict=True):
        if cost <= room:
            out.append(page)
            out_costs.append(cost)
            continue
        pieces = _cut(page, room, count_many)
        out.extend(pieces)
        out_costs.extend(_page_costs(pieces, count_many))
    return out, out_costs


def _cut(page: PageText, room: int, count_many: CountMany) -> list[PageText]:
    pieces: list[PageText] = []
    text = page.text
    while text:
        cost = _page_costs([PageText(page.number, text)], count_many)[0]
        if cost <= room:
            pieces.append(PageText(page.number, text))
            break
        # Aim a little short of the proportional cut, then back off to a natural break.
        limit = max(1, int(len(text) * room / cost * 0.9))
        cut = _natural_break(text, limit)
        pieces.append(PageText(page.number, text[:cut].rstrip()))
        text = text[cut:].lstrip()
    return pieces


def _natural_break(text: str, limit: int) -> int:
    for separator in ("\n\n", "\n", ". ", " "):
        at = text.rfind(separator, 0, limit)
        if at > limit // 2:
            return at + len(separator)
    return limit


def group_partials(partials: list[T], *, fits: Callable[[list[T]], bool]) -> list[list[T]]:
    """Consecutive groups of partial summaries, each as large as ``fits`` allows (at least one)."""
    groups: list[list[T]] = []
    current: list[T] = []
    for partial in partials:
        if current and not fits([*current, partial]):
            groups.append(current)
            current = []
        current.append(partial)
    if current:
        groups.append(current)
    return groups
