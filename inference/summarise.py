"""Build a summary request that fits the model's context.

A document that fits is sent whole. One that does not is cut at the last page that fits, and
the result says which pages the summary covers (map-reduce over sections comes with the
[tasks] issue). Token counts come from the engine host, which holds the model's tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inference.prompts import PageText, summary_messages

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class SummaryPlan:
    messages: Messages
    pages_used: int
    pages_total: int
    note: str  # empty when the whole document was read


def plan_summary(
    *,
    title: str,
    pages: list[PageText],
    length: str,
    focus: str,
    context_tokens: int,
    max_output_tokens: int,
    count_tokens: Callable[[Messages], int],
) -> SummaryPlan:
    budget = context_tokens - max_output_tokens

    def build(selected: list[PageText]) -> Messages:
        return summary_messages(title=title, pages=selected, length=length, focus=focus)

    if not pages:
        raise ValueError("a document with no pages cannot be summarised")
    whole = build(pages)
    if count_tokens(whole) <= budget:
        return SummaryPlan(whole, len(pages), len(pages), "")

    # The largest prefix of pages that fits (at least one page is always tried).
    low, high = 1, len(pages) - 1
    best = 0
    while low <= high:
        middle = (low + high) // 2
        if count_tokens(build(pages[:middle])) <= budget:
            best, low = middle, middle + 1
        else:
            high = middle - 1
    if best == 0:
        first = pages[0]
        text = first.text
        while text and count_tokens(build([PageText(first.number, text)])) > budget:
            text = text[: int(len(text) * 0.8)]
        if not text:
            raise ValueError("the model's context is too small for this instruction")
        note = f"This summary covers only the start of page {first.number} of {len(pages)}: the document is longer than the model's context."
        return SummaryPlan(build([PageText(first.number, text)]), 1, len(pages), note)
    note = f"This summary covers pages 1-{best} of {len(pages)}: the rest does not fit in the model's context."
    return SummaryPlan(build(pages[:best]), best, len(pages), note)
