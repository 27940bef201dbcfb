"""inference/summarise.py: plan_summary fits a document into the model's context."""

from __future__ import annotations

import pytest

from inference.prompts import PageText, summary_messages
from inference.summarise import plan_summary


def fake_count_tokens(messages) -> int:
    """A stand-in for the engine's tokenizer: one token per four characters of content."""
    return sum(len(m["content"]) for m in messages) // 4


def _pages(count: int, chars: int = 400) -> list[PageText]:
    return [PageText(n, f"Page {n} text. " + ("x" * chars)) for n in range(1, count + 1)]


def _tokens_for(pages, *, title="Doc", length="standard", focus="") -> int:
    return fake_count_tokens(summary_messages(title=title, pages=pages, length=length, focus=focus))


def _plan(pages, *, context_tokens, max_output_tokens=100, counter=fake_count_tokens, title="Doc", focus=""):
    return plan_summary(
        title=title,
        pages=pages,
        length="standard",
        focus=focus,
        context_tokens=context_tokens,
        max_output_tokens=max_output_tokens,
        count_tokens=counter,
    )


def test_short_document_fits_whole_with_empty_note():
    pages = _pages(3)
    plan = _plan(pages, context_tokens=10_000)
    assert plan.pages_used == 3
    assert plan.pages_total == 3
    assert plan.note == ""
    assert plan.messages == summary_messages(title="Doc", pages=pages, length="standard", focus="")


def test_document_that_fits_exactly_is_whole():
    pages = _pages(4)
    needed = _tokens_for(pages)
    plan = _plan(pages, context_tokens=needed + 100, max_output_tokens=100)
    assert plan.pages_used == 4
    assert plan.note == ""


def test_output_tokens_are_taken_from_the_budget():
    pages = _pages(4)
    needed = _tokens_for(pages)
    # The context alone would hold the document, but not with room for the answer.
    plan = _plan(pages, context_tokens=needed + 99, max_output_tokens=100)
    assert plan.pages_used < 4


@pytest.mark.parametrize("page_count", [5, 10, 37])
@pytest.mark.parametrize("fraction", [0.4, 0.6, 0.9])
def test_long_document_is_cut_at_the_largest_prefix_that_fits(page_count, fraction):
    pages = _pages(page_count)
    max_output = 200
    budget = int(_tokens_for(pages) * fraction)
    assert _tokens_for(pages[:1]) <= budget  # at least one whole page fits (trimming is tested below)
    plan = _plan(pages, context_tokens=budget + max_output, max_output_tokens=max_output)
    used = plan.pages_used
    assert 1 <= used < page_count
    assert plan.pages_total == page_count
    assert _tokens_for(pages[:used]) <= budget  # the chosen prefix fits
    assert _tokens_for(pages[: used + 1]) > budget  # one more page would not
    assert plan.messages == summary_messages(title="Doc", pages=pages[:used], length="standard", focus="")
    assert fake_count_tokens(plan.messages) <= budget
    assert f"pages 1-{used} of {page_count}" in plan.note


def test_two_pages_of_which_only_the_first_fits():
    pages = _pages(2)
    budget = _tokens_for(pages[:1]) + 5
    plan = _plan(pages, context_tokens=budget + 100, max_output_tokens=100)
    assert plan.pages_used == 1
    assert plan.note == "This summary covers pages 1-1 of 2: the rest does not fit in the model's context."


def test_cut_document_user_message_ends_at_the_last_used_page():
    pages = _pages(6)
    budget = _tokens_for(pages[:3]) + 10  # three pages fit, four do not
    assert _tokens_for(pages[:4]) > budget
    plan = _plan(pages, context_tokens=budget + 50, max_output_tokens=50)
    assert plan.pages_used == 3
    user = plan.messages[-1]["content"]
    assert "[page 3]" in user
    assert "[page 4]" not in user
    assert plan.note == "This summary covers pages 1-3 of 6: the rest does not fit in the model's context."


def test_pages_of_uneven_size():
    sizes = [100, 2000, 50, 50, 3000, 10]
    pages = [PageText(n, "y" * size) for n, size in enumerate(sizes, start=1)]
    budget = _tokens_for(pages[:4]) + 5
    plan = _plan(pages, context_tokens=budget + 10, max_output_tokens=10)
    assert plan.pages_used == 4
    assert _tokens_for(pages[:5]) > budget


def test_single_huge_first_page_is_trimmed_to_fit():
    pages = [PageText(1, "The opening words. " + "z" * 40_000), *_pages(3)[1:]]
    budget = 1_000
    plan = _plan(pages, context_tokens=budget + 100, max_output_tokens=100)
    assert plan.pages_used == 1
    assert plan.pages_total == 3
    assert fake_count_tokens(plan.messages) <= budget
    user = plan.messages[-1]["content"]
    assert "[page 1]\nThe opening words." in user  # the start of page 1 is kept
    assert "[page 2]" not in user
    assert len(user) < len(pages[0].text)  # it was really cut
    assert "start of page 1 of 3" in plan.note


def test_single_page_document_too_long_is_trimmed():
    pages = [PageText(1, "Beginning. " + "w" * 20_000)]
    plan = _plan(pages, context_tokens=800, max_output_tokens=100)
    assert plan.pages_used == 1
    assert plan.pages_total == 1
    assert fake_count_tokens(plan.messages) <= 700
    assert "Beginning." in plan.messages[-1]["content"]
    assert plan.note != ""


def test_context_too_small_for_the_instruction_raises():
    with pytest.raises(ValueError, match="too small"):
        _plan(_pages(2), context_tokens=10, max_output_tokens=5)


def test_empty_pages_raise_value_error():
    with pytest.raises(ValueError, match="no pages"):
        _plan([], context_tokens=10_000)


def test_focus_and_title_are_kept_in_a_cut_plan():
    pages = _pages(8)
    budget = _tokens_for(pages[:2], title="Lease", focus="rent") + 1
    plan = _plan(pages, context_tokens=budget + 10, max_output_tokens=10, title="Lease", focus="rent")
    assert plan.pages_used == 2
    user = plan.messages[-1]["content"]
    assert 'title="Lease"' in user
    assert "Focus on: rent." in user


def test_counter_is_called_a_logarithmic_number_of_times():
    calls = []

    def fake_counting_tokens(messages):
        calls.append(1)
        return fake_count_tokens(messages)

    pages = _pages(1000, chars=40)
    budget = _tokens_for(pages[:321])
    plan = _plan(pages, context_tokens=budget + 10, max_output_tokens=10, counter=fake_counting_tokens)
    assert plan.pages_used == 321
    assert len(calls) <= 15  # whole document + a binary search, not one count per page
