"""inference/facts.py: the facts of a sentence that its passage does not state (pure)."""

from __future__ import annotations

import pytest

from inference.facts import facts_of, missing_facts

PASSAGE = (
    "The Supplier shall not disclose Confidential Information to any third party. The term is six (6) months "
    "from June 1, 2024, and fees of $5,000 are payable within thirty (30) days. Acme Ltd may terminate on "
    "90 days' notice, and interest accrues at 4% a year from 2024-07-15."
)


@pytest.mark.parametrize(
    "sentence",
    [
        "The Supplier shall not disclose Confidential Information to any third party.",
        "Fees of $5,000 are payable within 30 days.",  # digits for words: the same number
        "Acme may terminate on ninety days' notice.",
        "We confirm that the term runs for six months from 1 June 2024.",
        "Interest accrues at four percent a year.",
        "Thank you for your letter of last week.",  # states nothing to check
    ],
)
def test_what_the_passage_states_in_other_words_is_not_missing(sentence):
    assert missing_facts(sentence, [PASSAGE]) == []


@pytest.mark.parametrize(
    ("sentence", "kind"),
    [
        ("The term is three months from June 1, 2024.", "number"),
        ("The term is six years from June 1, 2024.", "quantity"),
        ("The term is six months from July 1, 2024.", "month"),
        ("Fees of $6,000 are payable within thirty days.", "number"),
        ("Interest accrues at 5% a year.", "number"),
        ("Interest accrues from 2024-08-15.", "date"),
        ("Beta Ltd may terminate on 90 days' notice.", "name"),
        ("The Customer shall not disclose Confidential Information.", "name"),
        ("Acme Ltd may not terminate on 90 days' notice.", "negation"),
        ("The Supplier may disclose Confidential Information to any third party.", "dropped_negation"),
    ],
)
def test_a_changed_number_date_name_or_negation_is_missing_with_what_it_is(sentence, kind):
    missing = missing_facts(sentence, [PASSAGE])
    assert kind in {fact.kind for fact in missing}, missing
    assert all(fact.describe() for fact in missing)


def test_numbers_in_words_and_digits_are_one_number_and_units_go_with_them():
    values = {(f.kind, f.value) for f in facts_of("within thirty (30) days, or five thousand dollars, or 1,000 units")}
    assert ("number", "30") in values and ("quantity", "30 day") in values
    assert ("number", "5000") in values and ("quantity", "5000 money") in values
    assert ("number", "1000") in values
    assert not any(f.kind == "number" for f in facts_of("a third party may apply"))  # an ordinal is no amount


def test_facts_of_several_cited_passages_count_together_and_no_passage_checks_nothing():
    assert missing_facts("Pay $5,000 within 90 days.", ["Pay $5,000.", "Notice of 90 days."]) == []
    assert missing_facts("Pay $5,000 within 90 days.", []) == []
