"""inference/sourcing.py: every statement of a summary points at a page that says something like
it, or says it has none (pure; the embedder is a fake, named so)."""

from __future__ import annotations

import numpy as np

from inference.sourcing import SourcePassage, model_pages, source_statements, strip_references

VOCABULARY = ["rent", "euros", "month", "notice", "terminate", "months", "insurance", "tenant", "weather"]


def fake_embed(texts: list[str]) -> np.ndarray:
    """A fake embedder: unit bag-of-words vectors over a tiny vocabulary."""
    rows = np.array([[float(w in text.lower()) for w in VOCABULARY] for text in texts], dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1, norms)


PASSAGES = [
    SourcePassage(1, 1, fake_embed(["The rent is 1,850 euros a month."])[0]),
    SourcePassage(2, 3, fake_embed(["The tenant may terminate with three months notice."])[0]),
    SourcePassage(4, 4, fake_embed(["The tenant keeps insurance."])[0]),
]


def test_references_the_model_wrote_are_read_within_the_document():
    assert model_pages("Rent is due monthly (p. 1).", 4) == [1]
    assert model_pages("See (pp. 2-3) and (Page 9).", 4) == [2, 3]  # page 9 does not exist
    assert model_pages("No reference here.", 4) == []
    assert strip_references("Rent is due (p. 1).") == "Rent is due ."


def test_each_statement_gets_the_page_that_supports_it():
    summary = (
        "The rent is 1,850 euros a month (p. 1). "
        "The tenant may terminate on three months notice (p. 1). "
        "The tenant may terminate with notice. "
        "The weather is fine (p. 4)."
    )
    statements = source_statements(summary, PASSAGES, last_page=4, embed=fake_embed)
    assert [(s.page, s.source) for s in statements] == [
        (1, "model"),  # the model's page says it
        (2, "matched"),  # the model named page 1, which does not: the page that does is given
        (2, "matched"),  # no reference: found
        (None, "none"),  # close to nothing in the document: said plainly
    ]
    assert statements[0].similarity > 0.9 and statements[-1].similarity < 0.45


def test_a_document_without_passages_sources_nothing():
    statements = source_statements("One. Two words here.", [], last_page=1, embed=fake_embed)
    assert [s.source for s in statements] == ["none", "none"]
    assert source_statements("", PASSAGES, last_page=4, embed=fake_embed) == []


def test_a_statement_whose_facts_its_page_does_not_state_gets_no_page_and_says_why():
    rent = "The rent is 1,850 euros a month."
    passages = [SourcePassage(1, 1, fake_embed([rent])[0], rent)]
    right, wrong = source_statements(
        "The rent is 1,850 euros a month (p. 1). The rent is 2,850 euros a month (p. 1).",
        passages,
        last_page=1,
        embed=fake_embed,
    )
    assert (right.page, right.source) == (1, "model")
    assert (wrong.page, wrong.source) == (None, "none") and wrong.similarity > 0.9
    assert any("2,850" in fact for fact in wrong.missing_facts)
