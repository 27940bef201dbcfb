"""Reranking search's candidates by clause titles and the question's terms (``documents.rerank``),
on passages written like real contracts' (numbered titles inline, articles in capitals)."""

from __future__ import annotations

from documents import rerank


def test_clause_titles_are_read_inline_from_numbered_clauses_and_articles():
    text = (
        "5.4 Taxes. All License Fees are exclusive of sales taxes.   5.5 Audit Right. During the Term and for five "
        "(5) years thereafter, Licensee shall maintain books.   (c) Notices. Any notice shall be in writing. "
        "ARTICLE ELEVEN APPLICABLE LAW; DISPUTE RESOLUTION     11.1 The execution of this Agreement shall be "
        "governed by the PRC Law.\nCONFIDENTIALITY\nEach party keeps the other's secrets."
    )
    assert rerank.titles(text) == [
        "Taxes",
        "Audit Right",
        "Notices",
        "APPLICABLE LAW; DISPUTE RESOLUTION",
        "CONFIDENTIALITY",
    ]
    # A sentence that happens to follow a number is not a title: too long to be one.
    assert rerank.titles("paid within 30 Days after the invoice is received by the Buyer and approved by it.") == []


def test_words_meet_by_their_stems():
    assert rerank.stem("termination") == rerank.stem("terminate") == rerank.stem("Terminated")
    assert rerank.stem("laws") == rerank.stem("law") and rerank.stem("State's") == "state"
    assert rerank.stem("assignment") == rerank.stem("assigned") == "assign"


def test_a_passage_under_the_title_the_question_names_moves_up():
    candidates = [
        rerank.Candidate(1, "Either party may give written notice to the other party under this Agreement."),
        rerank.Candidate(2, "The Licensee shall keep records and make them available to the other party."),
        rerank.Candidate(
            3,
            "and appropriate personnel, available during normal business hours for inspection.",
            before="Royalties are paid quarterly.   5.5 Audit Right. During the Term Licensee shall maintain books",
        ),
    ]
    order = rerank.rerank(["audit", "right", "books", "records"], candidates)
    assert order[0] == 3  # it starts under "Audit Right", which the question names
    assert order.index(2) < order.index(1)  # the records passage holds more of the question's terms
    assert rerank.rerank([], candidates) == [1, 2, 3]  # nothing to compare: the arms' order stands
    assert rerank.rerank(["zebra"], candidates) == [1, 2, 3]
