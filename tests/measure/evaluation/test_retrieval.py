"""Retrieval measured (``evaluate --tasks retrieval``): recall@k of the draft's retrieval on the
reply gold set and on one question per labelled category of real CUAD contracts; the pure parts
(placing a labelled span in extracted text, judging that a passage holds it) on small texts."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from measure.evaluation import retrieval
from measure.evaluation.contracts import ENTITY_CATEGORIES, load_contracts
from measure.evaluation.run import DEFAULT_CONTRACTS


def test_a_span_is_placed_by_its_words_whatever_the_line_breaks_and_spacing():
    text = "1. Term.\nThe term of this\nAgreement is five (5)   years\nfrom the Effective Date.\n\n2. Law. New York."
    locator = retrieval.Locator(text)
    target = locator.locate("The term of this Agreement is five (5) years from the Effective Date.")
    assert text[target.start : target.end] == "The term of this\nAgreement is five (5)   years\nfrom the Effective Date"
    assert locator.locate("governed by the laws of Delaware") is None


def test_a_span_whose_middle_was_extracted_differently_is_placed_by_its_ends():
    text = "Recitals. Licensee shall not assign or transfer this Agree-\nment or any right under it without the prior written consent of Licensor. Notices."
    span = "Licensee shall not assign or transfer this Agreement or any right under it without the prior written consent of Licensor."
    target = retrieval.Locator(text).locate(span)
    assert target is not None and text[target.start : target.end].startswith("Licensee shall")
    assert text[target.start : target.end].endswith("of Licensor")
    # Only one end found, once: the span is placed from it, as long as it is.
    target = retrieval.Locator(text).locate(span.replace("of Licensor", "of the Licensor hereunder"))
    assert target is not None and text[target.start : target.end].startswith("Licensee shall")


def test_a_passage_holds_a_target_when_they_share_half_of_the_shorter():
    target = retrieval.Target(100, 200)
    assert retrieval.covers((90, 160), target)  # 60 of the target's 100
    assert not retrieval.covers((0, 140), target)  # 40 of 100
    assert retrieval.covers((120, 150), target)  # the passage lies inside a long clause
    assert not retrieval.covers((200, 300), target)
    ranked = [(1, 0, 50), (2, 100, 180), (1, 110, 190)]
    assert retrieval.first_rank(ranked, 1, [target]) == 3  # document 2's passage is another document's
    assert retrieval.first_rank(ranked, 3, [target]) is None


def test_recall_counts_a_question_found_at_or_before_k():
    figures = retrieval.recall_figures([1, 4, None, 2])
    assert figures["recall@1"] == 0.25 and figures["recall@3"] == 0.5 and figures["recall@6"] == 0.75
    assert figures["mrr"] == round((1 + 1 / 4 + 1 / 2) / 4, 3)


def test_every_clause_category_of_the_contracts_has_a_question():
    questions = retrieval.load_questions()
    labelled = {c for contract in load_contracts(DEFAULT_CONTRACTS) for c, spans in contract.labels.items() if spans}
    assert labelled - ENTITY_CATEGORIES <= set(questions)
    assert not set(questions) & ENTITY_CATEGORIES  # a name or a date is not a passage to find
    assert all(q.endswith("?") for q in questions.values())


@pytest.mark.django_db(transaction=True)
def test_retrieval_is_measured_on_the_reply_gold_set_and_real_contracts_through_the_real_ingest(tmp_path):
    # Three real CUAD-dev contracts, as PDFs, in a folder laid out like the set.
    (tmp_path / "pdf").mkdir()
    chosen = load_contracts(DEFAULT_CONTRACTS)[:3]
    for contract in chosen:
        shutil.copy(contract.files["pdf"], tmp_path / "pdf" / contract.files["pdf"].name)
    labels = json.loads((DEFAULT_CONTRACTS / "labels.json").read_text())
    (tmp_path / "labels.json").write_text(
        json.dumps([item for item in labels if item["id"] in {c.key for c in chosen}])
    )

    out = StringIO()
    call_command("evaluate", "--tasks", "retrieval", "--contracts", str(tmp_path), "--limit", "5", stdout=out)
    printed = out.getvalue()
    results = json.loads(Path(printed.rsplit("results saved to ", 1)[1].strip()).read_text())["retrieval"]

    replies = results["replies"]
    assert results["k"] == 6 and replies["requests"] == 5 and replies["questions"] > replies["requests"]
    assert replies["recall@1"] <= replies["recall@3"] <= replies["recall@6"]
    assert replies["recall@6"] >= 0.5  # most of the gold requests' expected passages are found (all 10: 0.77)
    assert replies["reranked"] is False and replies["other_way"]["questions"] == replies["questions"]

    contracts = results["contracts"]
    asked = sum(1 for c in chosen for cat, spans in c.labels.items() if spans and cat not in ENTITY_CATEGORIES)
    assert contracts["contracts"] == 3
    assert contracts["questions"] + contracts["categories_not_placed"] == asked
    assert contracts["categories_not_placed"] <= 1  # the labelled spans are found in the PDFs' text
    assert sum(c["asked"] for c in contracts["per_category"].values()) == contracts["questions"]
    assert contracts["recall@6"] > 0.5
    # Each question not answered among the six is named, with how far down its passage was.
    missed = round((1 - contracts["recall@6"]) * contracts["questions"])
    assert len(contracts["misses"]) == missed
    assert all(m["rank"] is None or m["rank"] > 6 for m in contracts["misses"])
    assert len(replies["misses"]) == round((1 - replies["recall@6"]) * replies["questions"])
    assert f"recall@6 {contracts['recall@6']:.3f}" in printed

    from documents.models import Document

    assert not Document.objects.filter(owner__username__startswith="evaluate").exists()
