"""The model-free parts of ``manage.py evaluate`` on the real CUAD-dev contracts: the quote
ceiling (how many of the lawyers' labelled clause spans some quote candidate matches, through
the ingest's own extraction) and the support checks on a contrast set; their pure parts on
fakes."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from measure.evaluation import contracts as contract_set
from measure.evaluation.run import DEFAULT_CONTRACTS


def test_on_real_contracts_quotes_reach_the_labelled_clauses_and_the_checks_catch_altered_facts():
    assert (DEFAULT_CONTRACTS / "labels.json").is_file(), f"the CUAD-dev set is expected at {DEFAULT_CONTRACTS}"
    out = StringIO()
    call_command("evaluate", "--tasks", "ceiling,contrast", "--seed", "7", stdout=out)
    printed = out.getvalue()
    saved = Path(printed.rsplit("results saved to ", 1)[1].strip())
    results = json.loads(saved.read_text())

    # The contrast set: sentences of real passages as written, and with a number, month, party or
    # negation altered; the draft check tells them apart, similarity alone does not.
    contrast = results["contrast"]
    assert contrast["seed"] == 7 and str(DEFAULT_CONTRACTS) in contrast["sources"]
    assert contrast["unchanged"] > 200 and set(contrast["by_change"]) >= {"number", "party", "negation added"}
    draft = contrast["draft_check"]
    assert draft["auroc"] >= 0.9 and draft["unchanged_flagged"] <= 0.05
    assert draft["auroc_similarity_alone"] < draft["auroc"]
    assert draft["similarity_alone_changed_flagged"] < 0.5  # the check before facts let most of them through
    assert all(share >= 0.8 for share in draft["changed_flagged"].values()), draft
    assert contrast["summary_check"]["unchanged_flagged"] <= 0.05
    assert f"AUROC {draft['auroc']:.3f}" in printed

    ceiling = results["ceiling"]
    pdf, txt = ceiling["pdf"], ceiling["txt"]
    assert pdf["contracts"] == txt["contracts"] == 30 and pdf["spans"] == txt["spans"] > 200
    assert pdf["ceiling"] >= 0.9 and txt["ceiling"] >= 0.9  # line-based candidates reached 0.50 here
    assert abs(ceiling["pdf_minus_txt"]) <= 0.03  # the layout hardly matters
    assert pdf["interval"][0] <= pdf["ceiling"] <= pdf["interval"][1]
    assert f"pdf: {pdf['ceiling']:.3f}" in printed


def test_a_folder_that_is_not_a_labelled_set_is_refused_with_what_is_missing(tmp_path):
    with pytest.raises(CommandError, match="has no labels.json"):
        call_command("evaluate", "--tasks", "ceiling", "--contracts", str(tmp_path), stdout=StringIO())
    (tmp_path / "labels.json").write_text(json.dumps([{"id": "c1", "labels": {}}]))
    with pytest.raises(CommandError, match="neither pdf/c1.pdf nor txt/c1.txt"):
        call_command("evaluate", "--tasks", "ceiling", "--contracts", str(tmp_path), stdout=StringIO())


def test_the_ceiling_counts_clause_spans_not_entities_and_gives_an_interval(tmp_path):
    (tmp_path / "txt").mkdir()
    labels = []
    for i in range(4):
        (tmp_path / "txt" / f"c{i}.txt").write_text("unused: a fake reader gives the pages")
        labels.append(
            {
                "id": f"c{i}",
                "labels": {
                    "Parties": ["Acme Inc."],  # an entity: not a quoted clause, not counted
                    "Governing Law": ["This Agreement is governed by the laws of the State of New York."],
                    "Audit Rights": ["The Buyer may audit the books of the Supplier once a year."],
                },
            }
        )
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    loaded = contract_set.load_contracts(tmp_path)

    def fake_pages(contract):  # the first two contracts hold their audit clause, the others do not
        audit = "The Buyer may audit the\nbooks of the Supplier once a year." if contract.key in ("c0", "c1") else ""
        return [f"1. Law. This Agreement is governed by the laws of the\nState of New York.\n{audit}"]

    result = contract_set.quote_ceiling(loaded, fake_pages)
    assert (result["spans"], result["matched"], result["ceiling"]) == (8, 6, 0.75)
    low, high = result["interval"]
    assert 0.5 <= low <= 0.75 <= high <= 1.0
    assert {m["category"] for m in result["misses"]} == {"Audit Rights"}

    # Per category, over the same resamplings of contracts: every law clause is matched in every
    # contract, the audit clause in half of them (a resample of four contracts holds none of the
    # matched ones, or only those, one time in sixteen: more than the 2.5 % at each end).
    assert result["per_category"] == {
        "Audit Rights": {"spans": 4, "matched": 2, "ceiling": 0.5, "interval": [0.0, 1.0]},
        "Governing Law": {"spans": 4, "matched": 4, "ceiling": 1.0, "interval": [1.0, 1.0]},
    }


def test_the_ceiling_per_category_counts_contracts_without_the_category_as_empty(tmp_path):
    (tmp_path / "txt").mkdir()
    law = "This Agreement is governed by the laws of the State of New York."
    insurance = ["The Supplier shall keep liability insurance of one million dollars.", "Nothing like the text."]
    labels = [{"id": f"c{i}", "labels": {"Governing Law": [law]}} for i in range(5)]
    labels[3]["labels"]["Insurance"] = insurance  # one contract of five has it: one span of two matched
    for item in labels:
        (tmp_path / "txt" / f"{item['id']}.txt").write_text("unused: a fake reader gives the pages")
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    loaded = contract_set.load_contracts(tmp_path)

    def fake_pages(contract):
        return [f"{law}\n{insurance[0]}"]

    per_category = contract_set.quote_ceiling(loaded, fake_pages)["per_category"]
    # The resamples without contract c3 have no insurance span: no share, left out, not 0.
    assert per_category["Insurance"] == {"spans": 2, "matched": 1, "ceiling": 0.5, "interval": [0.5, 0.5]}
    assert per_category["Governing Law"]["interval"] == [1.0, 1.0]
    alone = contract_set.quote_ceiling(loaded[3:4], fake_pages)["per_category"]  # one contract: no interval
    assert alone["Insurance"] == {"spans": 2, "matched": 1, "ceiling": 0.5, "interval": None}


def test_the_contrast_set_alters_one_fact_at_a_time_and_keeps_the_sentence_as_written():
    from measure.evaluation.contrast import build_contrast_set

    passage = "Acme Ltd shall pay the fee of 5,000 euros by 1 March 2025. The notice period is thirty days."
    cases = build_contrast_set([passage], seed=3)
    assert {c.change for c in cases} >= {"none", "number", "month", "party", "negation added"}
    written = [c.sentence for c in cases if not c.changed]
    assert written == [
        "Acme Ltd shall pay the fee of 5,000 euros by 1 March 2025.",
        "The notice period is thirty days.",
    ]
    for case in cases:
        assert case.passage == passage
        if case.changed:
            assert case.sentence not in written
    assert build_contrast_set([passage], seed=3) == cases  # the seed decides the alterations


def test_auroc_by_ranks():
    from measure.evaluation.contrast import auroc

    assert auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auroc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5  # a tie counts half
    assert auroc([0.3], [True]) is None


def test_clause_scores_count_per_category_and_give_intervals_over_contracts():
    from measure.evaluation.metrics import Counts

    per_contract = [
        {"Governing Law": Counts(matched=1, predicted=1, labelled=1), "Audit Rights": Counts(0, 2, 1)},
        {"Governing Law": Counts(matched=1, predicted=1, labelled=1)},
        {"Governing Law": Counts(matched=0, predicted=0, labelled=1), "Insurance": Counts(1, 1, 2)},
    ]
    scores = contract_set.clause_scores(per_contract)
    assert (scores["matched"], scores["predicted"], scores["labelled"]) == (3, 5, 6)
    assert scores["precision"] == 0.6 and scores["recall"] == 0.5
    assert scores["per_category"]["Governing Law"]["recall"] == round(2 / 3, 3)
    assert scores["per_category"]["Audit Rights"]["precision"] == 0.0
    for name in ("precision", "recall", "f1"):
        low, high = scores["interval"][name]
        assert 0.0 <= low <= scores[name] <= high <= 1.0  # resampled contracts, not clauses
    assert contract_set.clause_scores(per_contract[:1])["interval"]["f1"] is None  # one contract: no interval

    # Per category, the same resamplings of contracts, a contract without the category counting
    # zero for it. Insurance is in one contract of three: every resample that holds it gives its
    # own figures, the others none (left out), so its interval is its point figure.
    insurance = scores["per_category"]["Insurance"]
    assert insurance["interval"] == {name: [insurance[name]] * 2 for name in ("precision", "recall", "f1")}
    assert insurance["recall"] == 0.5 and insurance["f1"] == round(2 / 3, 3)
    law = scores["per_category"]["Governing Law"]
    assert law["interval"]["precision"] == [1.0, 1.0]  # every kept law quote matched
    low, high = law["interval"]["recall"]
    assert low < law["recall"] < high == 1.0  # the third contract's missed clause: in some resamples only
    assert scores["per_category"]["Audit Rights"]["interval"]["f1"] == [0.0, 0.0]
    single = contract_set.clause_scores(per_contract[:1])["per_category"]
    assert single["Governing Law"]["interval"] == {"precision": None, "recall": None, "f1": None}


def test_clause_scores_per_category_intervals_resample_every_contract_as_the_overall_ones_do():
    from measure.evaluation.metrics import Counts

    # Renewal Term: recall 1 in every contract that has it, whatever the precision.
    per_contract = [
        {"Renewal Term": Counts(1, 1, 1), "Governing Law": Counts(0, 1, 1)},
        {"Renewal Term": Counts(2, 4, 2)},
        {"Governing Law": Counts(1, 1, 1)},
        {"Renewal Term": Counts(1, 2, 1), "Governing Law": Counts(1, 2, 2)},
        {},
        {"Governing Law": Counts(0, 0, 1)},
        {"Renewal Term": Counts(1, 3, 1), "Governing Law": Counts(2, 2, 3)},
        {"Audit Rights": Counts(1, 2, 1)},
    ]
    scores = contract_set.clause_scores(per_contract, seed=4)
    renewal = scores["per_category"]["Renewal Term"]
    assert renewal["recall"] == 1.0 and renewal["interval"]["recall"] == [1.0, 1.0]
    low, high = renewal["interval"]["precision"]
    assert low < renewal["precision"] == 0.5 < high
    assert scores["per_category"]["Audit Rights"]["interval"]["f1"] == [0.667, 0.667]  # one contract of eight
    for category, entry in scores["per_category"].items():
        # The category's figures are those of the contracts with only that category kept, every
        # contract still a unit (with no counts): the same draws as the overall interval.
        alone = contract_set.clause_scores(
            [{category: c[category]} if category in c else {} for c in per_contract], seed=4
        )
        assert entry == {k: v for k, v in alone.items() if k != "per_category"}, category
        for name in ("precision", "recall", "f1"):
            low, high = entry["interval"][name]
            assert low <= entry[name] <= high
    assert scores["per_category"]["Governing Law"]["interval"] != scores["interval"]  # not the overall's


def test_the_long_document_plants_each_fact_once_in_its_third_and_the_seed_decides():
    from measure.evaluation.gold import fact_covered
    from measure.evaluation.longdoc import build_long_document, coverage_by_third

    title, pages, planted = build_long_document(seed=11)
    assert len(pages) == 150 and pages[0].startswith(title)
    assert build_long_document(seed=11) == (title, pages, planted) and build_long_document(seed=12)[1] != pages
    assert [p.third for p in planted] == [1] * 4 + [2] * 4 + [3] * 4
    whole = "\n".join(pages)
    for fact in planted:
        assert fact.fact.fact in pages[fact.fact.page - 1]
        assert (fact.third - 1) * 50 < fact.fact.page <= fact.third * 50
        for (term,) in fact.fact.terms:  # distinctive: nowhere else in the document
            assert whole.count(term) == 1, term
        assert fact_covered(fact.fact, f"The summary says: {fact.fact.fact}")
    assert all(250 <= len(page.split()) <= 450 for page in pages)

    scores = coverage_by_third(planted, [True] * 4 + [True, True, False, False] + [False] * 4)
    assert scores["by_third"] == {1: 1.0, 2: 0.5, 3: 0.0} and scores["largest_gap"] == 1.0
    assert scores["coverage"] == 0.5


def test_when_one_evaluation_task_fails_the_others_stop_waiting_for_their_jobs():
    import threading
    import time

    from measure.evaluation.run import _run_tasks

    class FakeEvaluation:  # a fake: one task fails at once, the other waits for jobs that never finish
        def __init__(self) -> None:
            self.stopping = threading.Event()

        def broken(self) -> dict:
            raise CommandError("the engine host is not answering")

        def waits(self) -> dict:
            if self.stopping.wait(60):
                raise CommandError("stopped")
            return {"waited": "to the end"}

    started = time.monotonic()
    with pytest.raises(CommandError, match="not answering"):
        _run_tasks(FakeEvaluation(), ["waits", "broken"])
    assert time.monotonic() - started < 10  # not the 60 s the other task would have waited
    fine = type("FakeFine", (), {"stopping": threading.Event(), "a": lambda self: {}})()
    assert set(_run_tasks(fine, ["a"])["a"]) == {"seconds"}  # a task that finishes says how long it took


def test_the_contracts_task_asks_the_categories_named_and_refuses_names_cuad_does_not_have():
    from inference.clauses import CUAD_CATEGORIES
    from measure.evaluation.contracts import ENTITY_CATEGORIES
    from measure.evaluation.run import contract_categories

    every = contract_categories(None)
    assert len(every) == 37 and not set(every) & ENTITY_CATEGORIES
    assert contract_categories("Governing Law, Renewal Term") == ["Renewal Term", "Governing Law"]  # CUAD's order
    assert contract_categories(["Audit Rights"]) == ["Audit Rights"]
    for wrong in ("Parties", "Renewal term", "Confidentiality"):  # an entity, a misspelling, not CUAD's
        with pytest.raises(CommandError, match=wrong):
            contract_categories(f"Governing Law,{wrong}")
    assert set(every) < set(CUAD_CATEGORIES)


def test_the_printed_table_gives_each_category_its_figures_intervals_and_ceiling():
    from measure.evaluation.metrics import Counts
    from measure.evaluation.run import table

    pdf = [{"Governing Law": Counts(1, 1, 1), "Audit Rights": Counts(0, 2, 1)}, {"Governing Law": Counts(1, 1, 1)}]
    txt = [{"Governing Law": Counts(1, 1, 1), "Audit Rights": Counts(1, 1, 1)}, {"Governing Law": Counts(0, 1, 1)}]
    ceiling = {"ceiling": 1.0, "per_category": {"Governing Law": {"spans": 2, "matched": 2, "ceiling": 1.0,
                                                                  "interval": [1.0, 1.0]}}}  # fmt: skip
    results = {
        "contracts": {
            "folder": "cuad-dev", "contracts": 2, "categories": 37, "ceiling": {"pdf": ceiling, "txt": ceiling},
            "pdf": contract_set.clause_scores(pdf), "txt": contract_set.clause_scores(txt),
        }
    }  # fmt: skip
    lines = table(results)
    law = next(line for line in lines if line.strip().startswith("Governing Law:"))
    assert "recall 1.000 [1.000, 1.000]" in law and "(2 matched of 2 kept, 2 labelled)" in law
    assert "ceiling 1.000 [1.000, 1.000]" in law and law.endswith("txt F1 0.500")
    audit = next(line for line in lines if line.strip().startswith("Audit Rights:"))
    assert "precision 0.000" in audit and "ceiling" not in audit and audit.endswith("txt F1 1.000")
