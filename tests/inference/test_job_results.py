"""The result of each job kind (``inference/job_results.py``): what a row holds, read back alike,
in the shape the rows have always had (the ``old_*`` helpers are the writers' code as it was
before the types, in ``running``, ``grounding`` and ``services.drafts``)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
from django.test import Client
from django.urls import reverse

from documents.search import Passage
from inference import grounding, services
from inference.clauses import Clause, verify_clauses
from inference.drafting import SentenceCheck, support_summary
from inference.job_results import (
    ChatResult,
    ClauseResult,
    DraftResult,
    DroppedQuote,
    Partial,
    PassageRecord,
    SummaryResult,
    Support,
    clause_from_json,
    result_for,
    statement_from_json,
)
from inference.models import Job, JobKind, Queue
from inference.sourcing import Statement
from tests.factories import ready_document

STATEMENTS = (
    Statement("Rent is paid monthly (p. 2).", 2, 0.81, "model"),
    Statement("The deposit is 42 pounds.", None, 0.33, "none", ("the number 42",)),
)
CHECKS = [
    SentenceCheck("Give three months' notice [1].", [1], [], 0.74, True),
    SentenceCheck("The fee is 9 [1][7].", [1], [7], 0.41, False, ["the number 9"]),
    SentenceCheck("Kind regards.", [], [], None, False),
]
PAGES = {1: "This lease runs for a year.\nEither party may terminate on thirty days' notice.", 2: "Rent is monthly."}
RAW_CLAUSES = [
    {"category": "Termination", "quote": "Either party may terminate on thirty days' notice.", "page": 1, "note": "n"},
    {"category": "Termination", "quote": "The landlord may never terminate.", "page": 1, "note": ""},
]
PASSAGE = Passage(
    chunk_id=7, document_id=3, document_title="Lease", page_start=2, page_end=3, text="Three months' notice.",
    score=0.9, char_start=10, char_end=31,
)  # fmt: skip


def _json(value):
    """What Postgres gives back of what was stored."""
    return json.loads(json.dumps(value))


def _clause_result() -> tuple[ClauseResult, list[dict], list[dict]]:
    verified = verify_clauses(RAW_CLAUSES, PAGES, ("Termination",))
    result = ClauseResult(
        taxonomy="office",
        categories=("Termination",),
        clauses=tuple(verified.clauses),
        proposed=len(RAW_CLAUSES),
        dropped=len(verified.dropped),
        dropped_examples=tuple(DroppedQuote.from_json(d) for d in verified.dropped[:20]),
        sections=2,
        incomplete_sections=1,
        resumed_parts=1,
    )
    return result, [asdict(c) for c in verified.clauses], verified.dropped


def _draft() -> DraftResult:
    return DraftResult(
        message="When must I give notice?",
        scope="the documents you chose",
        passages=(grounding.passage_record(1, PASSAGE),),
        sentences=tuple(CHECKS),
        support=Support.from_json(support_summary(CHECKS)),
    )


EXAMPLES = [
    SummaryResult(sections=("page 1",)),
    SummaryResult(sections=("page 1",), statements=None, sourced=True),
    SummaryResult(
        sections=("pages 1-4", "pages 5-8"),
        partials=(Partial("pages 1-4", "The lease."), Partial("pages 5-8", "The rent.")),
        statements=STATEMENTS,
        sourced=True,
        resumed_parts=2,
    ),
    _clause_result()[0],
    ClauseResult(taxonomy="cuad", categories=("Governing Law",)),
    _draft(),
    replace(_draft(), edited_text="Give notice.", edited_at="2026-12-03T10:00:00+00:00", edit_version=2),
    replace(
        _draft(),
        edited_text="Give notice [1].",
        edited_at="2026-12-03T10:00:00+00:00",
        edit_version=1,
        edited_sentences=(CHECKS[0],),
        edited_support=Support.from_json(support_summary(CHECKS[:1])),
    ),
    replace(_draft(), edited_text="x", edit_version=3, edited_sentences=(), edited_support=Support(error=True)),
    ChatResult(),
]


@pytest.mark.parametrize("result", EXAMPLES, ids=lambda r: type(r).__name__)
def test_what_is_written_reads_back_the_same(result):
    assert type(result).from_json(result.to_json()) == result
    assert type(result).from_json(_json(result.to_json())) == result  # as it comes back from the database
    assert result_for({SummaryResult: "summarise", ClauseResult: "extract_clauses", DraftResult: "draft",
                       ChatResult: "chat"}[type(result)], _json(result.to_json())) == result  # fmt: skip


def test_a_summary_row_keeps_the_shape_it_always_had():
    # One section, statements sourced (run_summary, then summary_statements).
    old = {"sections": ["page 1"], "statements": [asdict(s) for s in STATEMENTS]}
    new = SummaryResult(sections=("page 1",), statements=STATEMENTS, sourced=True)
    assert _json(new.to_json()) == _json(old)
    assert list(new.to_json()["statements"][1]) == [
        "text", "page", "similarity", "source", "missing_facts",
    ]  # fmt: skip
    # A long document, some parts resumed, passages embedded by another model: statements null.
    old = {
        "sections": ["pages 1-4", "pages 5-8"],
        "partials": [{"pages": label, "text": text} for label, text in [("pages 1-4", "a"), ("pages 5-8", "b")]],
        "resumed_parts": 2,
        "statements": None,
    }
    new = SummaryResult(
        sections=("pages 1-4", "pages 5-8"),
        partials=(Partial("pages 1-4", "a"), Partial("pages 5-8", "b")),
        resumed_parts=2,
        statements=None,
        sourced=True,
    )
    assert _json(new.to_json()) == old
    # An empty summary has no statements key; one section has no partials, none resumed no count.
    assert SummaryResult(sections=("page 1",)).to_json() == {"sections": ["page 1"]}


def test_a_clause_row_keeps_the_shape_it_always_had():
    result, clauses, dropped = _clause_result()
    assert len(clauses) == 1 and len(dropped) == 1  # one quote found, one the page does not have
    old = {
        "taxonomy": "office",
        "categories": ["Termination"],
        "clauses": clauses,
        "proposed": 2,
        "dropped": 1,
        "dropped_examples": dropped[:20],
        "sections": 2,
        "incomplete_sections": 1,
        "resumed_parts": 1,
    }
    assert _json(result.to_json()) == _json(old)
    assert list(result.to_json()) == list(old)
    assert list(result.to_json()["clauses"][0]) == [
        "category", "quote", "page", "start", "end", "note", "match", "end_page",
    ]  # fmt: skip
    assert "resumed_parts" not in replace(result, resumed_parts=0).to_json()


def test_a_draft_row_keeps_the_shape_it_always_had():
    old_passage = {"number": 1, **{k: v for k, v in asdict(PASSAGE).items() if k != "score"}}
    assert grounding.passage_record(1, PASSAGE).to_json() == old_passage
    old = {
        "message": "When must I give notice?",
        "scope": "the documents you chose",
        "passages": [old_passage],
        "sentences": [asdict(check) for check in CHECKS],
        "support": support_summary(CHECKS),
    }
    draft = _draft()
    assert _json(draft.to_json()) == _json(old)
    assert list(draft.to_json()) == list(old)
    # An edit adds its five keys (draft_edit), then its check fills two of them (_store_edit_check).
    edited_old = {
        **old,
        "edited_text": "Give notice [1].",
        "edited_at": "2026-12-03T10:00:00+00:00",
        "edit_version": 1,
        "edited_sentences": None,
        "edited_support": None,
    }
    edited = replace(draft, edited_text="Give notice [1].", edited_at="2026-12-03T10:00:00+00:00", edit_version=1)
    assert _json(edited.to_json()) == _json(edited_old)
    checked_old = {**edited_old, "edited_sentences": [asdict(CHECKS[0])], "edited_support": support_summary(CHECKS[:1])}
    checked = replace(
        edited, edited_sentences=(CHECKS[0],), edited_support=Support.from_json(support_summary(CHECKS[:1]))
    )
    assert _json(checked.to_json()) == _json(checked_old)
    failed_old = {**edited_old, "edited_sentences": [], "edited_support": {"error": True}}
    assert replace(edited, edited_sentences=(), edited_support=Support(error=True)).to_json() == failed_old
    assert ChatResult().to_json() == {}


def test_an_older_row_without_optional_keys_reads_with_the_defaults():
    assert SummaryResult.from_json({}) == SummaryResult()
    assert result_for("summarise", None) == SummaryResult() and result_for("chat", {}) == ChatResult()
    # Kept before a quote could cross a page break: it ends on the page it starts on.
    old_clause = {
        "category": "Term",
        "quote": "One year.",
        "page": 4,
        "start": 3,
        "end": 12,
        "note": "",
        "match": "exact",
    }
    assert clause_from_json(old_clause) == Clause("Term", "One year.", 4, 3, 12, "", "exact", 4)
    clauses = ClauseResult.from_json({"clauses": [old_clause], "proposed": 3})
    assert (clauses.taxonomy, clauses.categories, clauses.dropped, clauses.resumed_parts) == ("office", (), 0, 0)
    # Kept before facts were compared: no missing facts.
    statement = statement_from_json({"text": "Rent is monthly.", "page": 2, "similarity": 0.8, "source": "matched"})
    assert statement == Statement("Rent is monthly.", 2, 0.8, "matched", ())
    draft = DraftResult.from_json(
        {
            "passages": [{"number": 1, "document_id": 5, "document_title": "Lease", "text": "Notice."}],
            "sentences": [{"text": "Give notice [1].", "supported": True, "citations": [1]}],
        }
    )
    assert draft.passages == (PassageRecord(number=1, document_id=5, document_title="Lease", text="Notice."),)
    assert draft.sentences == (SentenceCheck("Give notice [1].", [1], [], None, True, []),)
    assert (draft.message, draft.support, draft.edited_text, draft.edit_version) == ("", None, None, 0)
    assert draft.current_sentences == draft.sentences and "edited_text" not in draft.to_json()


def test_the_draft_as_it_now_is_is_the_edit_once_there_is_one():
    draft = _draft()
    assert draft.current_sentences == tuple(CHECKS) and draft.current_support == draft.support
    edited = replace(draft, edited_text="Mine.", edit_version=1)
    assert edited.current_sentences is None and edited.current_support is None  # being checked
    assert PassageRecord.from_json(draft.passages[0].to_json()).numbered().source == "Lease, pp. 2-3"


# --- the rows as the services write them and the API and exports serve them -----------------


def _stored(owner, kind, data, document=None) -> Job:
    return Job.objects.create(
        owner=owner,
        kind=kind,
        queue=Queue.DECODE if kind == JobKind.DRAFT else Queue.PREFILL,
        state=Job.State.SUCCEEDED,
        document=document,
        result_text="Model text [1].",
        result_data=data,
    )


@pytest.mark.django_db
def test_an_edit_and_its_check_keep_the_rows_keys_and_the_api_serves_the_same_keys(alice):
    lease = ready_document(alice, "Lease", "Three months' notice.")
    stored = _json(replace(_draft(), passages=(replace(_draft().passages[0], document_id=lease.pk),)).to_json())
    job = _stored(alice, JobKind.DRAFT, stored)
    services.draft_edit(job=job, text="Give notice [1].")
    job.refresh_from_db()
    assert set(job.result_data) == set(stored) | {
        "edited_text", "edited_at", "edit_version", "edited_sentences", "edited_support",
    }  # fmt: skip
    assert {k: job.result_data[k] for k in stored} == stored  # the model's draft is kept as it was
    assert (job.result_data["edit_version"], job.result_data["edited_sentences"]) == (1, None)
    services.draft_check_failed(job_id=job.pk, version=1)
    job.refresh_from_db()
    assert (job.result_data["edited_sentences"], job.result_data["edited_support"]) == ([], {"error": True})
    assert not services.draft_check_edit(job_id=job.pk, version=2)  # no such edit: nothing checked

    client = Client()
    client.force_login(alice)
    body = client.get(f"/api/v1/jobs/{job.pk}").json()
    data = body["result"]["data"]
    # The keys the API always served for an edited draft: the edit's check stands for the model's.
    assert set(data) == {"message", "scope", "passages", "sentences", "support", "edited_at", "edit_version"}
    assert body["result"]["text"] == "Give notice [1]."
    assert (data["sentences"], data["support"]) == ([], {"error": True})
    assert data["passages"] == stored["passages"]


@pytest.mark.django_db
def test_one_persons_edits_are_checked_one_after_another_by_one_queued_check(
    alice, django_user_model, monkeypatch, django_capture_on_commit_callbacks
):
    """Each check embeds up to 20,000 characters in a decode worker: a person saving edits of
    many drafts queues one check of their edits, which takes them one after another (and those
    saved while it runs), so their edits cannot take every worker thread from other people's
    jobs; the next edit after it queues a check again."""
    from inference import tasks
    from inference.services import drafts

    bob = django_user_model.objects.create_user(username="bob", password="another long password")
    stored = _json(_draft().to_json())
    mine = [_stored(alice, JobKind.DRAFT, stored) for _ in range(3)]
    bobs = _stored(bob, JobKind.DRAFT, stored)
    from inference.streaming import sync_client

    sync_client().delete(*(drafts.EDIT_CHECKS_KEY.format(owner=user.pk) for user in (alice, bob)))  # earlier runs'
    queued: list[int] = []
    monkeypatch.setattr(tasks.check_drafts, "apply_async", lambda args, queue: queued.append(args[0]))
    checked: list[tuple[int, int]] = []

    def fake_check(*, job_id, version):  # a fake of the embedding check: records, and stores a verdict
        checked.append((job_id, version))
        if len(checked) == 1:  # an edit saved while the check runs is taken by the same run
            services.draft_edit(job=mine[2], text="Edited while the others were checked.")
        return drafts._store_edit_check(job_id, version, sentences=(), support=Support())

    monkeypatch.setattr(drafts, "draft_check_edit", fake_check)

    def edit(job: Job, text: str) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            services.draft_edit(job=job, text=text)

    for job in mine:
        edit(job, "Give notice [1].")
    edit(mine[0], "Give three months' notice [1].")
    edit(bobs, "Bob's notice [1].")
    assert queued == [alice.pk, bob.pk]  # one check for all of alice's edits, one for bob's
    assert services.draft_checks_run(owner_id=alice.pk) == 4
    # The oldest edit first; a superseded one (mine[2]'s first) is passed over by the real check.
    assert checked == [(mine[1].pk, 1), (mine[2].pk, 1), (mine[0].pk, 2), (mine[2].pk, 2)]
    assert drafts.edits_to_check(alice.pk) == [] and drafts.edits_to_check(bob.pk) == [(bobs.pk, 1)]
    edit(mine[1], "Another edit, after the check.")
    assert queued == [alice.pk, bob.pk, alice.pk]  # the check is over: the next edit queues one


@pytest.mark.django_db
def test_the_clause_export_serves_the_row_as_stored(alice):
    lease = ready_document(alice, "Lease", PAGES[1])
    stored = _json(_clause_result()[0].to_json())
    job = _stored(alice, JobKind.EXTRACT_CLAUSES, stored, document=lease)
    client = Client()
    client.force_login(alice)
    exported = client.get(reverse("inference:clauses_export", args=[job.pk, "json"])).json()
    assert exported == {"document": "Lease", "job": str(job.pk), **stored}
    assert client.get(f"/api/v1/jobs/{job.pk}").json()["result"]["data"] == stored
    csv = client.get(reverse("inference:clauses_export", args=[job.pk, "csv"])).content.decode()
    assert csv.splitlines()[1] == "Termination,1,1,Either party may terminate on thirty days' notice.,n,exact"
