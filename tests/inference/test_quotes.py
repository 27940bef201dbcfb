"""inference/quotes.py: quote candidates rebuilt from wrapped lines, page breaks, running headers
and footers, with a segmenter that knows contracts' abbreviations (pure)."""

from __future__ import annotations

import re

from inference.quotes import quote_candidates, running_lines

FOOTER = "Source: ACME CORP, 10-K, 3/1/2020"


def _page(number: int, body: str) -> str:
    return f"ACME SUPPLY AGREEMENT\n{body}\n{number}\n{FOOTER}"


# Hard-wrapped as a PDF has it: every line is cut mid-sentence, page 1 ends in the middle of one.
PAGES = [
    (
        1,
        _page(
            1,
            "1. Definitions. \u201cProducts\u201d means the goods listed in Sec. 2.1(a) of Exhibit A, as\n"
            "supplied by Acme Inc. to the Buyer from time to time under this Agreement.\n"
            "2. Term. This Agreement begins on the Effective Date and continues for three (3) years\n"
            "unless terminated earlier under Section 9, and it renews for successive one-year terms\n"
            "unless either party gives notice of non-renewal at least ninety (90) days before the end of",
        ),
    ),
    (
        2,
        _page(
            2,
            "the then-current term. Notices go to the address in No. 5 of the U.S. schedule.\n"
            "3. Liability. IN NO EVENT SHALL EITHER PARTY BE LIABLE FOR ANY INDIRECT, INCIDENTAL OR\n"
            "CONSEQUENTIAL DAMAGES ARISING OUT OF THIS AGREEMENT, WHETHER IN CONTRACT OR IN TORT.\n"
            "4. Assignment. Neither party may assign this Agreement without the other's consent, except:\n"
            "(a) to an Affiliate of the assigning party; or\n"
            "(b) to a successor to all or substantially all of its business, upon written notice to the\n"
            "other party of such assignment and of the successor's address for notices.",
        ),
    ),
    (3, _page(3, "5. Payment. The Buyer shall pay each invoice within thirty (30) days of its date.")),
]


def _texts(**kwargs) -> list[str]:
    return [c.text for c in quote_candidates(PAGES, max_chars=kwargs.get("max_chars", 400))]


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def test_a_sentence_wrapped_over_lines_is_one_candidate():
    assert (
        "This Agreement begins on the Effective Date and continues for three (3) years unless terminated earlier "
        "under Section 9, and it renews for successive one-year terms unless either party gives notice of "
        "non-renewal at least ninety (90) days before the end of the then-current term."
    ) in _texts()


def test_running_headers_footers_and_page_numbers_are_left_out():
    assert {"acme supply agreement", "source: acme corp, #-k, #/#/#"} <= running_lines(PAGES)
    for text in _texts():
        assert FOOTER not in text and "ACME SUPPLY AGREEMENT" not in text
        assert not re.search(r"the end of \d", text)  # the page number between the two halves is gone


def test_a_sentence_across_a_page_break_is_located_on_both_pages():
    (candidate,) = [
        c
        for c in quote_candidates(PAGES, max_chars=400)
        if c.text.startswith("This Agreement begins") and c.text.endswith("then-current term.")
    ]
    stored = dict(PAGES)
    assert (candidate.page, candidate.end_page) == (1, 2)
    assert stored[1][candidate.start :].startswith("This Agreement begins")
    assert stored[2][: candidate.end].endswith("then-current term.")


def test_abbreviations_do_not_end_a_sentence():
    texts = _texts()
    assert (
        "\u201cProducts\u201d means the goods listed in Sec. 2.1(a) of Exhibit A, as supplied by Acme Inc. to the "
        "Buyer from time to time under this Agreement."
    ) in texts
    assert "Notices go to the address in No. 5 of the U.S. schedule." in texts
    assert not any(t.endswith(("Sec.", "Inc.", "No.", "U.S.")) for t in texts)


def test_a_clause_in_capitals_is_not_cut_into_headings():
    assert (
        "IN NO EVENT SHALL EITHER PARTY BE LIABLE FOR ANY INDIRECT, INCIDENTAL OR CONSEQUENTIAL DAMAGES ARISING "
        "OUT OF THIS AGREEMENT, WHETHER IN CONTRACT OR IN TORT."
    ) in _texts()


def test_sub_clauses_alone_and_with_the_sentence_that_leads_into_them():
    texts = _texts(max_chars=1000)
    assert "(a) to an Affiliate of the assigning party; or" in texts
    lead = "Neither party may assign this Agreement without the other's consent, except:"
    assert lead in texts
    assert any(t.startswith(lead) and "(a) to an Affiliate" in t and "(b) to a successor" in t for t in texts)


def test_runs_of_consecutive_sentences_are_candidates_too():
    assert (
        "5. Payment. The Buyer shall pay each invoice within thirty (30) days of its date."
    ) in _texts()  # the whole paragraph
    assert any(t.startswith("Term. This Agreement begins") for t in _texts())  # two sentences


def test_every_candidate_has_the_stored_texts_words_at_its_place():
    stored = dict(PAGES)
    same_page = [c for c in quote_candidates(PAGES, max_chars=400) if c.page == c.end_page]
    assert len(same_page) > 10
    for c in same_page:
        assert _words(c.text) == _words(stored[c.page][c.start : c.end])


def test_a_long_sentence_is_cut_at_a_word_boundary_and_hyphenation_is_joined():
    long = [(1, "The Supplier shall " + "promptly " * 80 + "deliver the goods and the termi-\nnation fee.")]
    found = quote_candidates(long, max_chars=120)
    assert found and all(len(c.text) <= 120 for c in found)
    assert all(not c.text.endswith("promp") for c in found)
    assert any("termination fee." in c.text for c in quote_candidates(long, max_chars=1000))


def test_no_pages_no_candidates():
    assert quote_candidates([], max_chars=400) == []
    assert quote_candidates([(1, "")], max_chars=400) == []
