"""The quote ceiling of ``manage.py evaluate``: how many of the lawyers' labelled clause spans
some quote candidate matches (CUAD's rule), on the real CUAD-dev contracts through the ingest's
own extraction, and its pure parts on fakes."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from inference.evaluation import contracts as contract_set
from inference.evaluation.run import DEFAULT_CONTRACTS


def test_quote_candidates_reach_nine_in_ten_labelled_clauses_of_real_contracts_pdf_and_text_alike():
    assert (DEFAULT_CONTRACTS / "labels.json").is_file(), f"the CUAD-dev set is expected at {DEFAULT_CONTRACTS}"
    out = StringIO()
    call_command("evaluate", "--tasks", "ceiling", stdout=out)
    printed = out.getvalue()
    saved = Path(printed.rsplit("results saved to ", 1)[1].strip())
    ceiling = json.loads(saved.read_text())["ceiling"]
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
