"""measure/evaluation/metrics.py: CUAD's matching rule and the counts (pure)."""

from __future__ import annotations

from measure.evaluation.metrics import Counts, Span, match_clauses, share, token_jaccard

NOTICE = "Either party may terminate this Agreement on ninety (90) days' written notice."


def test_word_jaccard_ignores_case_and_punctuation():
    assert token_jaccard(NOTICE, NOTICE.upper().replace("'", "")) == 1.0
    assert token_jaccard("a b c d", "c d e f") == 2 / 6
    assert token_jaccard("", "") == 1.0 and token_jaccard("x", "") == 0.0


def test_a_prediction_matches_a_label_of_its_category_at_half_overlap_once():
    labels = [Span("Termination", NOTICE), Span("Governing Law", "This Agreement is governed by the laws of Ireland.")]
    half = "Either party may terminate this Agreement"  # 6 of the label's 12 words: Jaccard 0.5
    assert token_jaccard(half, NOTICE) == 0.5
    counts = match_clauses([Span("Termination", half)], labels)
    assert (counts.matched, counts.predicted, counts.labelled) == (1, 1, 2)
    # The same words under another category, or a little less overlap, do not count.
    assert match_clauses([Span("Governing Law", half)], labels).matched == 0
    assert match_clauses([Span("Termination", "Either party may terminate this")], labels).matched == 0
    # Two predictions of one label: one is a true positive, the other a false positive.
    twice = match_clauses([Span("Termination", NOTICE), Span("Termination", half)], labels)
    assert (twice.matched, twice.precision, twice.recall) == (1, 0.5, 0.5)


def test_the_best_pair_wins_whatever_the_order_of_predictions():
    labels = [Span("Parties", "Acme Ltd and Borealis GmbH"), Span("Parties", "Acme Ltd")]
    predicted = [Span("Parties", "Acme Ltd and Borealis"), Span("Parties", "Acme Ltd")]
    assert match_clauses(predicted, labels).matched == 2
    assert match_clauses(list(reversed(predicted)), labels).matched == 2


def test_precision_recall_and_f1_are_micro_averaged():
    total = Counts()
    total.add(Counts(matched=2, predicted=4, labelled=2))
    total.add(Counts(matched=1, predicted=1, labelled=4))
    assert total.as_dict() == {
        "matched": 3, "predicted": 5, "labelled": 6, "precision": 0.6, "recall": 0.5, "f1": 0.545,
    }  # fmt: skip
    assert Counts(labelled=3).as_dict()["precision"] is None  # nothing predicted: undefined, not zero
    assert Counts(matched=0, predicted=2, labelled=2).f1 == 0.0
    assert share(1, 3) == 0.333 and share(0, 0) is None


def test_the_evaluations_own_support_judge_wants_the_numbers_and_most_words_of_a_sentence_in_what_it_cites():
    from measure.evaluation.metrics import lexically_supported

    passage = "Invoices are due within 30 days of receipt. Late payments accrue interest at 2 per cent a month."
    assert lexically_supported("Invoices are due within 30 days of receipt [1].", [passage])
    assert lexically_supported("Late payments accrue interest of 2 per cent monthly [1][2].", [passage])
    assert not lexically_supported("Invoices are due within 60 days of receipt [1].", [passage])  # a number changed
    assert not lexically_supported("The warehouse closes early on public holidays [1].", [passage])  # other words
    assert not lexically_supported("Invoices are due within 30 days of receipt.", [])  # cites nothing
    # Its own citation marks are not numbers it states; forms of a word meet ("terminate", "termination").
    assert lexically_supported("Either party may terminate [3].", ["Termination: either party may end it."])
