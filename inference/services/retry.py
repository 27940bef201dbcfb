"""Trying a failed or cancelled job again, of any kind: the same request, checked again, from the
parts the old job finished."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from inference.models import Job, JobKind
from inference.prompts import (
    DEFAULT_SUMMARY_LENGTH,
)
from inference.services.drafts import _draft_again
from inference.services.jobs import JobRejected, job_create_chat, job_create_clauses, job_create_summary


def job_retry(*, job: Job, user: AbstractBaseUser) -> Job:
    """A new job with the same request as a failed or cancelled one (checked again: the document
    must still be there, ready and readable, and the queue not full). A long document's job
    starts from the parts the old one finished: each is used only for the same request (the
    same text of the same section, the same options) to the same model."""
    if job.state not in (Job.State.FAILED, Job.State.CANCELLED):
        raise JobRejected("Only a failed or cancelled job can be tried again.")
    options = job.options
    if job.kind == JobKind.DRAFT:
        return _draft_again(job, owner=user)
    if job.kind == JobKind.CHAT:
        return job_create_chat(
            owner=user,
            messages=options["messages"],
            max_tokens=int(options["max_tokens"]),
            temperature=float(options.get("temperature", 0.0)),
            top_p=float(options.get("top_p", 1.0)),
            seed=options.get("seed"),
            stop=options.get("stop", ()),
            frequency_penalty=float(options.get("frequency_penalty", 0.0)),
            ignore_eos=bool(options.get("ignore_eos", False)),
        )
    from documents.selectors import document_for_user

    document = document_for_user(user=user, document_id=job.document_id) if job.document_id else None
    if document is None:
        raise JobRejected("The document of this job is no longer there for you.")
    if job.kind == JobKind.SUMMARISE:
        return job_create_summary(
            owner=user,
            document=document,
            length=options.get("length", DEFAULT_SUMMARY_LENGTH),
            focus=options.get("focus", ""),
            max_tokens=options.get("max_tokens"),
            ignore_eos=bool(options.get("ignore_eos", False)),
            checkpoint=job.checkpoint,
        )
    return job_create_clauses(
        owner=user,
        document=document,
        taxonomy=options["taxonomy"],
        categories=options.get("categories"),
        checkpoint=job.checkpoint,
    )
