"""inference/clauses.py: taxonomy, schema and quote verification (pure)."""

from __future__ import annotations

import pytest

from inference.clauses import (
    CUAD_CATEGORIES,
    TAXONOMIES,
    categories_for,
    clause_schema,
    quote_choices,
    verify_clauses,
    verify_quote,
)

PAGES = {
    1: "MASTER SERVICES AGREEMENT\nThis Agreement is made between Acme Ltd (the \u201cSupplier\u201d) and Beta plc.",
    2: "7. Confidentiality. Each party shall keep the other party\u2019s Confidential Information secret and shall not "
    "disclose it to any third party without prior written consent.\n8. Payment. The Customer shall pay each invoice "
    "within thirty (30) days of receipt. Late pay-\nments bear interest at 4% above base rate.",
    3: "12. Termination. Either party may terminate this Agreement on ninety days\u2019 written notice.",
}


def test_the_taxonomies():
    assert len(CUAD_CATEGORIES) == 41
    assert len(TAXONOMIES["cuad"]) == 46
    assert "Confidentiality" in TAXONOMIES["cuad"] and "Cap On Liability" in TAXONOMIES["cuad"]
    assert categories_for("cuad", ["Termination", "Governing Law"]) == ("Governing Law", "Termination")
    with pytest.raises(ValueError, match="not in the office taxonomy"):
        categories_for("office", ["Governing Law"])
    with pytest.raises(ValueError, match="unknown taxonomy"):
        categories_for("nonsense")


def test_the_schema_limits_categories_and_pages():
    schema = clause_schema(("Confidentiality", "Termination"), [2, 3])
    item = schema["properties"]["clauses"]["items"]
    assert item["properties"]["category"]["enum"] == ["Confidentiality", "Termination"]
    assert item["properties"]["page"]["enum"] == [2, 3]
    assert set(item["required"]) == {"category", "quote", "page", "note"}
    assert item["additionalProperties"] is False


def test_an_exact_quote_is_found_with_its_span():
    quote = "Either party may terminate this Agreement"
    match = verify_quote(quote, 3, PAGES)
    assert match.page == 3 and match.how == "exact"
    assert PAGES[3][match.start : match.end] == quote


def test_curly_quotes_whitespace_and_hyphenation_are_normalised():
    quote = "keep the other party's  Confidential\nInformation secret"
    match = verify_quote(quote, 2, PAGES)
    assert match.how == "normalised"
    assert PAGES[2][match.start : match.end] == "keep the other party\u2019s Confidential Information secret"
    late = verify_quote("Late payments bear interest", 2, PAGES)
    assert late is not None and PAGES[2][late.start : late.end].startswith("Late pay-")


def test_a_quote_on_another_page_is_found_there():
    match = verify_quote("The Customer shall pay each invoice within thirty (30) days", 1, PAGES)
    assert match.page == 2


def test_a_close_paraphrase_of_the_same_words_is_a_fuzzy_match():
    quote = "The Customer shall pay every invoice within thirty (30) days of receipt."
    match = verify_quote(quote, 2, PAGES)
    assert match is not None and match.how == "fuzzy" and match.ratio >= 0.9
    assert "pay each invoice" in PAGES[2][match.start : match.end]


def test_an_invented_quote_is_rejected():
    assert verify_quote("The Supplier shall indemnify the Customer against all losses.", 2, PAGES) is None
    assert verify_quote("Either party may terminate immediately for any reason at all.", 3, PAGES) is None
    assert verify_quote("", 2, PAGES) is None


def test_verify_clauses_keeps_the_texts_own_words_and_counts_what_it_drops():
    raw = [
        {
            "category": "Termination",
            "quote": "Either party may terminate this Agreement on ninety days' written notice",
            "page": 3,
            "note": "90 days",
        },
        {
            "category": "Indemnification",
            "quote": "The Supplier indemnifies the Customer for everything.",
            "page": 2,
            "note": "invented",
        },
        {"category": "Governing Law", "quote": "This Agreement is made between", "page": 1, "note": "not selected"},
        {
            "category": "Termination",
            "quote": "Either party may terminate this Agreement on ninety days' written notice",
            "page": 3,
            "note": "twice",
        },
    ]
    result = verify_clauses(raw, PAGES, ("Termination", "Indemnification"))
    assert [c.category for c in result.clauses] == ["Termination"]
    clause = result.clauses[0]
    assert clause.quote == PAGES[3][clause.start : clause.end]
    assert "\u2019" in clause.quote  # the page's apostrophe, not the model's
    assert len(result.dropped) == 2
    assert {d["category"] for d in result.dropped} == {"Indemnification", "Governing Law"}


def test_quotes_can_be_held_to_the_sections_own_sentences():
    choices = quote_choices(sorted(PAGES.items()))
    texts = [c.text for c in choices]
    assert "MASTER SERVICES AGREEMENT" not in texts  # three words: a heading, not a clause
    assert (
        "Each party shall keep the other party\u2019s Confidential Information secret and "
        "shall not disclose it to any third party without prior written consent." in texts
    )
    for choice in choices:  # each where its page has it ("pay-\nments": one word)
        stored = PAGES[choice.page][choice.start : choice.end]
        assert choice.page == choice.end_page and stored.replace("-\n", "").split() == choice.text.split()
    assert len(texts) == len(set(texts))
    schema = clause_schema(("Confidentiality",), [1, 2], texts)
    assert schema["properties"]["clauses"]["items"]["properties"]["quote"] == {"type": "string", "enum": texts}
    # Too many sentences for a small grammar: free text again, verified afterwards as before.
    many = [f"Sentence number {i} of a long document." for i in range(900)]
    assert (
        "maxLength"
        in clause_schema(("Confidentiality",), [1], many)["properties"]["clauses"]["items"]["properties"]["quote"]
    )
    long_line = "The Supplier shall " + "really " * 100 + "deliver."
    assert all(len(c.text) <= 400 for c in quote_choices([(1, long_line)]))


def test_a_quote_the_model_was_offered_is_located_across_the_page_break():
    pages = {
        1: "4. Term. This Agreement continues for three (3) years and renews for one-year terms unless\n"
        "either party gives notice of non-renewal at least ninety (90) days before the end of",
        2: "the then-current term.\n5. Payment. The Customer pays within thirty (30) days.",
    }
    offered = quote_choices(sorted(pages.items()))
    (across,) = [c for c in offered if c.page == 1 and c.end_page == 2 and c.text.startswith("This Agreement")]
    raw = [{"category": "Termination", "quote": across.text, "page": 1, "note": ""}]
    (clause,) = verify_clauses(raw, pages, ("Termination",), offered).clauses
    assert (clause.page, clause.end_page, clause.match) == (1, 2, "candidate")
    assert clause.quote == across.text and clause.quote.endswith("the end of the then-current term.")
    assert pages[1][clause.start :].startswith("This Agreement") and pages[2][: clause.end].endswith("term.")
    # Without the offer the same words are looked for, and no one page holds them all: at best
    # a near match of the part on the first page.
    (alone,) = verify_clauses(raw, pages, ("Termination",)).clauses
    assert alone.match == "fuzzy" and alone.end_page == 1 and not alone.quote.endswith("term.")


def test_words_offered_in_two_places_are_placed_on_the_page_the_model_named():
    repeated = "The Supplier shall keep all records for six years after delivery."
    pages = {1: f"1. Records. {repeated}", 2: f"9. Survival. {repeated}"}
    offered = quote_choices(sorted(pages.items()))
    for page in (1, 2):
        raw = [{"category": "Termination", "quote": repeated, "page": page, "note": ""}]
        (clause,) = verify_clauses(raw, pages, ("Termination",), offered).clauses
        assert clause.page == page and pages[page][clause.start : clause.end] == repeated
