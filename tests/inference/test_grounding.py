"""Drafting's retrieval is restricted to what the author may read: the scope is checked when the
job is created and again, in SQL, when the worker searches. Real Postgres, real embedder; no
engine (that is tests/inference/test_draft_jobs.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from inference import grounding, services
from inference.models import Job, JobKind, Queue
from tests.factories import ready_document

pytestmark = pytest.mark.django_db

SECRET = "The settlement with Northwind is 2.4 million euros, payable by 31 March; the board keeps it confidential."
LEASE = "The tenant may terminate the lease with three months' notice in writing to the landlord."
PAYMENT = "Invoices are payable within thirty days of receipt; late payment carries interest of 4 percent."


@pytest.fixture
def people():
    User = get_user_model()
    alice = User.objects.create_user("alice", password="pw-alice-long-enough")
    bob = User.objects.create_user("bob", password="pw-bob-long-enough")
    finance = Group.objects.create(name="Finance")
    alice.groups.add(finance)
    bob.groups.add(finance)
    return alice, bob, finance


@pytest.fixture
def library(people):
    alice, bob, finance = people
    secret = ready_document(alice, "settlement-memo", SECRET)  # alice's alone
    shared = ready_document(alice, "payment-terms", PAYMENT)
    shared.shared_with.add(finance)
    lease = ready_document(bob, "lease", LEASE)
    return secret, shared, lease


def test_a_reply_never_rests_on_a_document_its_author_may_not_read(people, library):
    _, bob, _ = people
    secret, shared, lease = library
    # Bob's message quotes the secret word for word: search would rank it first if it could see it.
    message = f"I heard that {SECRET} Is that right? And when are invoices payable?"
    passages = grounding.retrieve(user=bob, message=message, scope=grounding.Scope())
    found = {p.document_id for p in passages}
    assert secret.pk not in found
    assert shared.pk in found  # shared with bob's group: readable
    # Alice, who owns it, does find it with the same message.
    alice_passages = grounding.retrieve(user=people[0], message=message, scope=grounding.Scope())
    assert alice_passages[0].document_id == secret.pk


def test_a_scope_naming_an_unreadable_document_is_refused_without_saying_it_exists(people, library):
    alice, bob, finance = people
    secret, shared, lease = library
    with pytest.raises(services.JobRejected, match=f"No such document: {secret.pk}"):
        services.job_create_draft(owner=bob, message="When is the settlement paid?", document_ids=[secret.pk])
    with pytest.raises(services.JobRejected, match="No such document: 999999"):
        services.job_create_draft(owner=bob, message="Hello?", document_ids=[999999])
    outsiders = Group.objects.create(name="Outsiders")
    with pytest.raises(services.JobRejected, match="not a member"):
        services.job_create_draft(owner=bob, message="Hello?", group_id=outsiders.pk)
    assert not Job.objects.exists()


def test_sharing_withdrawn_while_the_job_waits_takes_the_document_out_of_its_search(people, library):
    alice, bob, finance = people
    secret, shared, lease = library
    job = services.job_create_draft(owner=bob, message="When are invoices payable?", group_id=finance.pk)
    assert job.kind == JobKind.DRAFT and job.queue == Queue.DECODE
    scope = grounding.Scope(document_ids=tuple(job.options["document_ids"]), group_id=job.options["group_id"])
    assert {p.document_id for p in grounding.retrieve(user=bob, message="invoices payable", scope=scope)} == {shared.pk}
    shared.shared_with.remove(finance)
    assert grounding.retrieve(user=bob, message="invoices payable", scope=scope) == []


def test_a_group_scope_searches_only_that_groups_documents(people, library):
    alice, bob, finance = people
    secret, shared, lease = library
    scope = grounding.draft_scope(user=bob, group_id=finance.pk)
    assert grounding.scope_document_ids(user=bob, scope=scope) == [shared.pk]  # not bob's own lease
    chosen = grounding.draft_scope(user=bob, document_ids=[lease.pk])
    assert grounding.scope_document_ids(user=bob, scope=chosen) == [lease.pk]


def test_draft_options_are_checked(people, library):
    _, bob, _ = people
    for kwargs, error in [
        ({"message": "  "}, "Paste or upload"),
        ({"message": "x" * 12_001}, "12,000"),
        ({"message": "Hello?", "tone": "sarcastic"}, "Unknown tone"),
        ({"message": "Hello?", "length": "epic"}, "Unknown length"),
    ]:
        with pytest.raises(services.JobRejected, match=error):
            services.job_create_draft(owner=bob, **kwargs)
    nobody = get_user_model().objects.create_user("dave", password="pw-dave-long-enough")
    with pytest.raises(services.JobRejected, match="nothing to ground the reply on"):
        services.job_create_draft(owner=nobody, message="Hello?")


def test_the_draft_form_starts_a_job_and_explains_what_it_refuses(people, library, django_capture_on_commit_callbacks):
    _, bob, finance = people
    secret, shared, lease = library
    client = Client()
    client.force_login(bob)
    page = client.get(reverse("inference:draft_new") + f"?document={lease.pk}").content.decode()
    assert f'<option value="{lease.pk}" selected>lease</option>' in page
    assert "settlement-memo" not in page  # alice's private document is not even offered

    refused = client.post(reverse("inference:draft_new"), {"message": "Hi?", "documents": [secret.pk]})
    assert refused.status_code == 400 and f"No such document: {secret.pk}" in refused.content.decode()
    assert "Hi?" in refused.content.decode()  # what was typed is kept

    hostile = SimpleUploadedFile("letter.pdf", b"%PDF-1.7\n" + b"\x00garbage" * 200, content_type="application/pdf")
    broken = client.post(reverse("inference:draft_new"), {"message": "", "message_file": hostile})
    assert broken.status_code == 400 and "letter.pdf:" in broken.content.decode()

    letter = SimpleUploadedFile("letter.txt", b"Dear landlord, how much notice must I give to end the lease?")
    with django_capture_on_commit_callbacks(execute=False):
        started = client.post(
            reverse("inference:draft_new"),
            {"message": "", "message_file": letter, "documents": [lease.pk], "tone": "friendly", "length": "short"},
        )
    job = Job.objects.get()
    assert started.status_code == 302 and started["Location"] == reverse("inference:job", args=[job.pk])
    assert job.options["message"].startswith("Dear landlord") and job.options["document_ids"] == [lease.pk]
    assert (job.options["tone"], job.options["length"], job.document_id) == ("friendly", "short", None)
    lease.delete()  # deleting a document the draft rests on leaves the draft
    assert Job.objects.filter(pk=job.pk).exists()


def test_only_the_author_edits_or_regenerates_a_draft(people, library):
    alice, bob, finance = people
    job = Job.objects.create(
        owner=bob, kind=JobKind.DRAFT, queue=Queue.DECODE, state=Job.State.SUCCEEDED,
        options={"message": "When?", "document_ids": [], "group_id": None, "tone": "neutral", "length": "short"},
    )  # fmt: skip
    client = Client()
    client.force_login(alice)
    for name in ("job", "draft_edit", "draft_regenerate"):
        method = client.get if name == "job" else client.post
        assert method(reverse(f"inference:{name}", args=[job.pk])).status_code == 404, name


def test_an_edit_is_not_checked_against_a_passage_whose_share_was_withdrawn(people, library):
    """The check of an edited draft says whether each sentence is supported and which of its
    facts the cited passage lacks: against a passage its author may no longer read, edit after
    edit, that would tell what the passage says. Such a citation is checked as one of a passage
    the draft does not have."""
    from inference.job_results import DraftResult, PassageRecord

    alice, bob, finance = people
    secret, shared, lease = library
    draft = DraftResult(
        message="When are invoices payable, and how much notice ends the lease?",
        passages=(
            PassageRecord(number=1, document_id=shared.pk, document_title="payment-terms", text=PAYMENT),
            PassageRecord(number=2, document_id=lease.pk, document_title="lease", text=LEASE),
        ),
    )
    job = Job.objects.create(owner=bob, kind=JobKind.DRAFT, queue=Queue.DECODE, state=Job.State.SUCCEEDED,
                             result_text="Drafted.", result_data=draft.to_json())  # fmt: skip
    shared.shared_with.remove(finance)  # alice withdraws the share after bob's draft
    edit = "Invoices are payable within sixty days [1]. The tenant may end the lease with three months' notice [2]."
    job = services.draft_edit(job=job, text=edit)
    assert services.draft_check_edit(job_id=job.pk, version=1)
    withdrawn, readable = DraftResult.from_json(Job.objects.get(pk=job.pk).result_data).edited_sentences
    assert (withdrawn.citations, withdrawn.unknown_citations, withdrawn.similarity) == ([], [1], None)
    assert not withdrawn.supported and withdrawn.missing_facts == []  # nothing said about "sixty days"
    assert readable.citations == [2] and readable.similarity is not None  # bob's own lease is checked as ever
