"""Trying a failed or cancelled job again, of any kind: the same request, checked again, from the
parts the old job finished."""

from __future__ import annotations

from django.contrib.auth.models import User

from inference.job_options import ChatOptions, ClauseOptions, SummaryOptions
from inference.models import Job, JobKind
from inference.services.drafts import _draft_again
from inference.services.jobs import JobRejected, job_create_chat, job_create_clauses, job_create_summary


def job_retry(*, job: Job, user: User) -> Job:
    """A new job with the same request as a failed or cancelled one (checked again: the document
    must still be there, ready and readable, and the queue not full). A long document's job
    starts from the parts the old one finished: each is used only for the same request (the
    same text of the same section, the same options) to the same model."""
    if job.state not in (Job.State.FAILED, Job.State.CANCELLED):
        raise JobRejected("Only a failed or cancelled job can be tried again.")
    if job.kind == JobKind.DRAFT:
        return _draft_again(job, owner=user)
    if job.kind == JobKind.CHAT:
        chat = ChatOptions.from_json(job.options)
        return job_create_chat(
            owner=user,
            messages=list(chat.messages),
            prompt=chat.prompt or None,
            max_tokens=chat.max_tokens,
            temperature=chat.temperature,
            top_p=chat.top_p,
            seed=chat.seed,
            stop=chat.stop,
            frequency_penalty=chat.frequency_penalty,
            extras=chat.extras,
            json_schema=chat.json_schema,
            ignore_eos=chat.ignore_eos,
        )
    from documents.selectors import document_for_user

    document = document_for_user(user=user, document_id=job.document_id) if job.document_id else None
    if document is None:
        raise JobRejected("The document of this job is no longer there for you.")
    if job.kind == JobKind.SUMMARISE:
        summary = SummaryOptions.from_json(job.options)
        return job_create_summary(
            owner=user,
            document=document,
            length=summary.length,
            focus=summary.focus,
            max_tokens=summary.max_tokens,
            ignore_eos=summary.ignore_eos,
            checkpoint=job.checkpoint,
        )
    clauses = ClauseOptions.from_json(job.options)
    return job_create_clauses(
        owner=user,
        document=document,
        taxonomy=clauses.taxonomy,
        categories=list(clauses.categories) or None,
        checkpoint=job.checkpoint,
    )
