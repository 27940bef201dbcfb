"""``manage.py evaluate`` end to end, one case per task, on the test session's workers and engine
host (the command uses an appliance that is running rather than starting its own)."""

from __future__ import annotations

import json
import shutil
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command

from documents.models import Document
from inference.clauses import CUAD_CATEGORIES
from inference.models import Job
from measure.evaluation.contracts import load_contracts
from measure.evaluation.gold import load_gold_set
from measure.evaluation.run import DEFAULT_CONTRACTS

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _one_contract(folder, key: str = "dev-23"):
    """A folder laid out like CUAD-dev holding one of its contracts (a short one, 464 words) as
    its PDF (the text layout is the same code path with another file; the suite's time is the
    model's)."""
    labels = [item for item in json.loads((DEFAULT_CONTRACTS / "labels.json").read_text()) if item["id"] == key]
    (folder / "labels.json").write_text(json.dumps(labels))
    (folder / "pdf").mkdir()
    shutil.copy(DEFAULT_CONTRACTS / "pdf" / f"{key}.pdf", folder / "pdf")
    return load_contracts(folder)[0]


ASKED = ("Expiration Date", "Renewal Term", "Price Restrictions", "Governing Law", "Cap On Liability")


def test_evaluate_scores_each_task_through_the_real_path_and_cleans_up(workers, engine_host, tmp_path):
    contract = _one_contract(tmp_path)
    out = StringIO()
    call_command(
        "evaluate",
        "--tasks",
        "clauses,summaries,replies,contracts,long",
        "--contracts",
        str(tmp_path),
        "--long-pages",
        "3",
        "--seed",
        "5",
        "--limit",
        "1",
        "--reply-scope",
        "chosen",
        # The contract's three labelled categories and two it has no label for (all 37 are the
        # same path with a longer answer; the suite's time is the model's).
        "--categories",
        ",".join(ASKED),
        stdout=out,
    )
    printed = out.getvalue()
    assert "using the running appliance's workers and engine host" in printed

    saved = sorted((settings.VAR_DIR / "evaluate").glob("evaluate-*.json"))[-1]
    assert str(saved) in printed
    results = json.loads(saved.read_text())
    gold = load_gold_set()
    office = {"Confidentiality", "Payment Terms", "Termination", "Indemnification", "Limitation Of Liability"}

    clauses = results["clauses"]
    assert clauses["failed"] == [] and clauses["cases"] == 1
    assert clauses["labelled"] == sum(c.category in office for c in gold.clauses[0].clauses)
    assert clauses["quotes_verified"] == clauses["predicted"] <= clauses["quotes_proposed"]
    assert f"recall {clauses['recall']:.3f}" in printed

    summaries = results["summaries"]
    assert summaries["failed"] == [] and summaries["facts"] == len(gold.summaries[0].facts)
    assert summaries["per_document"][0]["summary"]  # the model's text is kept for reading

    replies = results["replies"]
    assert replies["failed"] == [] and replies["expected_passages"] == len(gold.replies[0].expected)
    assert replies["sentences"] > 0 and replies["distractor_passages_cited"] == 0
    assert replies["distractor_passages_retrieved"] == 0
    assert results["model"] == engine_host.stats()["model"]

    # A real CUAD contract from its PDF: its clauses scored per category, the ceiling of the same
    # file beside them.
    contracts = results["contracts"]
    assert contracts["failed"] == [] and contracts["contracts"] == 1 and contracts["categories"] == len(ASKED)
    assert results["options"]["categories"] == sorted(ASKED, key=CUAD_CATEGORIES.index)
    scores = contracts["pdf"]
    assert {c for c, _ in contract.clause_spans()} <= set(ASKED)
    assert scores["labelled"] == len(contract.clause_spans()) == contracts["ceiling"]["pdf"]["spans"]
    assert scores["matched"] <= scores["predicted"]  # each match is a kept quote of its own
    assert set(scores["per_category"]) >= {c for c, _ in contract.clause_spans()}
    kept = {c["category"] for entry in contracts["per_contract"] for c in entry["kept"]}
    assert kept <= set(ASKED)  # no other category was asked for
    assert [(c["contract"], c["layout"]) for c in contracts["per_contract"]] == [("dev-23", "pdf")]
    assert "txt" not in contracts and "pdf_minus_txt" not in contracts  # one layout: nothing to compare
    assert "contracts through the model (1 contracts" in printed and "  pdf: precision " in printed

    # The generated long document (3 pages here, 150 by default): one fact planted in each third,
    # the summary's coverage scored per third.
    long = results["long"]
    assert long["failed"] == [] and long["seed"] == 5 and long["pages"] == 3 and long["facts"] == 3
    assert set(long["by_third"]) == {"1", "2", "3"} and long["summary"]
    assert long["covered"] == 3 - len(long["missed"])
    assert "long document (3 generated pages" in printed

    # The evaluation's documents and jobs are gone afterwards.
    assert not Document.objects.filter(owner__username__startswith="evaluate").exists()
    assert not Job.objects.filter(owner__username__startswith="evaluate").exists()
