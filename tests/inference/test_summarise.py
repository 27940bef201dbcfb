"""inference/summarise.py: cutting a document into sections that fit, for map-reduce (pure)."""

from __future__ import annotations

import pytest

from inference.prompts import PageText, section_messages
from inference.summarise import SECTION_RESERVE_TOKENS, Section, group_partials, section_budget_tokens, split_sections

CONTEXT = 4096
BUDGET = CONTEXT - SECTION_RESERVE_TOKENS


def fake_count_many(prompts) -> list[int]:
    """A fake of the engine's token counter: one token per four characters, plus 3 per message
    for the chat template. Counted per call, like the real one."""
    fake_count_many.calls += 1
    return [sum(len(m["content"]) // 4 + 3 for m in messages) for messages in prompts]


fake_count_many.calls = 0


def _pages(sizes: list[int]) -> list[PageText]:
    return [PageText(n, f"Page {n} starts. " + ("word " * (size // 5))) for n, size in enumerate(sizes, start=1)]


def _split(pages, context=CONTEXT):
    return split_sections(title="Lease", pages=pages, context_tokens=context, count_many=fake_count_many)


def _cost(section: Section) -> int:
    return fake_count_many([section_messages(title="Lease", pages=list(section.pages), instruction="")])[0]


def _all_text(sections) -> str:
    return " ".join(piece.text for section in sections for piece in section.pages)


def test_a_short_document_is_one_section():
    pages = _pages([2000, 2000])
    sections = _split(pages)
    assert len(sections) == 1
    assert sections[0].pages == tuple(pages)
    assert sections[0].page_label == "pages 1-2"


@pytest.mark.parametrize("sizes", [[3000] * 20, [500, 9000, 200, 200, 6000, 100, 4000], [12_000] * 3, [40] * 400])
def test_no_section_is_over_budget_and_every_page_is_read_once_in_order(sizes):
    pages = _pages(sizes)
    sections = _split(pages)
    assert len(sections) > 1
    for section in sections:
        assert _cost(section) <= BUDGET
    numbers = [piece.number for section in sections for piece in section.pages]
    assert numbers == sorted(numbers)
    assert set(numbers) == {page.number for page in pages}  # every page reaches a section
    # All the text is there, once: a long page's pieces join back into the page.
    assert _all_text(sections).split() == " ".join(page.text for page in pages).split()
    assert [s.index for s in sections] == list(range(len(sections)))


def test_a_page_longer_than_a_section_is_cut_between_sentences_and_keeps_its_number():
    text = " ".join(f"Sentence {i} of the long schedule sets out one more obligation." for i in range(600))
    sections = _split([PageText(1, "Short cover page."), PageText(2, text), PageText(3, "Signatures.")])
    pieces = [piece for section in sections for piece in section.pages if piece.number == 2]
    assert len(pieces) > 1
    assert all(piece.text.endswith(".") for piece in pieces[:-1])  # cut at a sentence end
    assert " ".join(piece.text for piece in pieces).split() == text.split()
    assert sections[-1].page_label.endswith("3")


def test_the_sections_do_not_depend_on_the_task():
    # Summaries and clause extraction call the same function with the same inputs: same cut.
    pages = _pages([3000] * 12)
    assert _split(pages) == _split(pages)


def test_counting_is_batched():
    pages = _pages([3000] * 50)
    fake_count_many.calls = 0
    _split(pages)
    assert fake_count_many.calls < 20  # not one call per page


def test_a_context_too_small_for_document_tasks_is_refused():
    with pytest.raises(ValueError, match="too small"):
        section_budget_tokens(1024)
    with pytest.raises(ValueError, match="no pages"):
        _split([])


def test_group_partials_makes_the_largest_groups_that_fit():
    partials = [f"p{i}" for i in range(7)]
    groups = group_partials(partials, fits=lambda group: len(group) <= 3)
    assert groups == [["p0", "p1", "p2"], ["p3", "p4", "p5"], ["p6"]]
    assert group_partials(partials, fits=lambda group: False) == [[p] for p in partials]  # one each at least
