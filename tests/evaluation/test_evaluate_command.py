"""``manage.py evaluate`` end to end, one case per task, on the test session's workers and engine
host (the command uses an appliance that is running rather than starting its own)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command

from documents.models import Document
from inference.evaluation.gold import load_gold_set
from inference.models import Job

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_evaluate_scores_each_task_through_the_real_path_and_cleans_up(workers, engine_host):
    out = StringIO()
    call_command("evaluate", "--limit", "1", "--reply-scope", "chosen", stdout=out)
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

    # The evaluation's documents and jobs are gone afterwards.
    assert not Document.objects.filter(owner__username__startswith="evaluate").exists()
    assert not Job.objects.filter(owner__username__startswith="evaluate").exists()
