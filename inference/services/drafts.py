"""Writes for drafted replies: create one grounded on documents, regenerate it, edit it (and check
the edit's support in a worker)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from uuid import UUID

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from appliance.broker import PUBLISH_ERRORS
from inference.drafting import MESSAGE_MAX_CHARS, SentenceCheck, check_support, support_summary
from inference.grounding import ScopeRejected, draft_scope, readable_ids
from inference.job_options import DraftOptions, storable_text
from inference.job_results import DraftResult, Support
from inference.lifecycle import celery_queue_for
from inference.models import Job, JobKind, Queue
from inference.prompts import (
    DEFAULT_DRAFT_LENGTH,
    DEFAULT_DRAFT_TONE,
    DRAFT_LENGTHS,
    DRAFT_TONES,
)
from inference.services.jobs import JobRejected, _job_create

logger = logging.getLogger(__name__)


DRAFT_MAX_DOCUMENTS = 200  # documents one draft may be grounded on by name (or choose a group, or all)


REGENERATE_TEMPERATURE = 0.7  # a regenerated draft samples, so that it can differ from the first


DRAFT_EDIT_MAX_CHARS = 20_000


def job_create_draft(
    *,
    owner: User,
    message: str,
    document_ids: list[int] | tuple[int, ...] = (),
    group_id: int | None = None,
    tone: str = DEFAULT_DRAFT_TONE,
    length: str = DEFAULT_DRAFT_LENGTH,
    temperature: float = 0.0,
    regenerated_from: Job | None = None,
    api_token=None,
) -> Job:
    """A reply to ``message`` on the decode queue, grounded on passages of the chosen documents,
    of the documents shared with one of the owner's groups, or (neither chosen) of every document
    the owner may read."""
    message = (message or "").strip()
    if not message:
        raise JobRejected("Paste or upload the message to reply to.", field="message")
    if len(message) > MESSAGE_MAX_CHARS:
        raise JobRejected(
            f"The message is {len(message):,} characters long; the limit is {MESSAGE_MAX_CHARS:,}. "
            "Paste the part that needs an answer.",
            field="message",
        )
    if tone not in DRAFT_TONES:
        raise JobRejected(f"Unknown tone {tone!r}; choose one of {', '.join(DRAFT_TONES)}.", field="tone")
    if length not in DRAFT_LENGTHS:
        raise JobRejected(f"Unknown length {length!r}; choose one of {', '.join(DRAFT_LENGTHS)}.", field="length")
    if not 0.0 <= temperature <= 2.0:
        raise JobRejected("temperature must be between 0 and 2.", field="temperature")
    if len(document_ids) > DRAFT_MAX_DOCUMENTS:
        raise JobRejected(
            f"{len(document_ids):,} documents were chosen; at most {DRAFT_MAX_DOCUMENTS} can be named. Choose a "
            "group instead, or none to search every document you may read.",
            field="document_ids",
        )
    try:
        scope = draft_scope(user=owner, document_ids=document_ids, group_id=group_id)
    except ScopeRejected as exc:
        raise JobRejected(str(exc), field=exc.field) from None
    options = DraftOptions(
        message=message,
        document_ids=tuple(scope.document_ids),
        group_id=scope.group_id,
        tone=tone,
        length=length,
        temperature=float(temperature),
        regenerated_from=None if regenerated_from is None else str(regenerated_from.pk),
    )
    # No ``document``: a draft rests on a scope, and deleting one of its documents must not delete
    # the reply (the passages it kept say which documents they came from).
    return _job_create(owner=owner, document=None, kind=JobKind.DRAFT, options=options.to_json(), api_token=api_token)


def job_regenerate_draft(*, job: Job, user: User, tone: str | None = None, length: str | None = None) -> Job:
    """A new draft for the same message and documents (tone and length may change), sampled so
    that it can differ from the one before."""
    if job.kind != JobKind.DRAFT:
        raise JobRejected("Only a drafted reply can be regenerated.")
    return _draft_again(
        job,
        owner=user,
        tone=tone or DraftOptions.from_json(job.options).tone,
        length=length or DraftOptions.from_json(job.options).length,
        temperature=REGENERATE_TEMPERATURE,
        regenerated_from=job,
    )


def _draft_again(job: Job, *, owner: User, **changes) -> Job:
    """A new draft with ``job``'s message, scope, tone, length and temperature, except ``changes``."""
    options = DraftOptions.from_json(job.options)
    request = {
        "message": options.message,
        "document_ids": options.document_ids,
        "group_id": options.group_id,
        "tone": options.tone,
        "length": options.length,
        "temperature": options.temperature,
    }
    return job_create_draft(owner=owner, **{**request, **changes})


def draft_edit(*, job: Job, text: str) -> Job:
    """Keep the person's edits of a finished draft; the edited text is then checked against the
    same passages (``tasks.check_draft``, in a worker that has the embedder)."""
    if job.kind != JobKind.DRAFT or job.state != Job.State.SUCCEEDED:
        raise JobRejected("Only a finished draft can be edited.")
    text = storable_text((text or "").strip())  # a pasted NUL costs a character, not the edit
    if not text:
        raise JobRejected("The edited draft is empty.")
    if len(text) > DRAFT_EDIT_MAX_CHARS:
        raise JobRejected(f"The edited draft is longer than {DRAFT_EDIT_MAX_CHARS:,} characters.")
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        draft = DraftResult.from_json(job.result_data)
        version = draft.edit_version + 1
        job.result_data = replace(
            draft,
            edited_text=text,
            edited_at=timezone.now().isoformat(),
            edit_version=version,
            edited_sentences=None,  # until the check below has run
            edited_support=None,
        ).to_json()
        job.save(update_fields=["result_data"])
        transaction.on_commit(lambda: _enqueue_draft_check(job.owner_id, job.pk, version))
    return job


# Held while a check of one person's edits is queued or running: however many drafts they save
# edits of, one worker thread checks them, one after another, and nobody else's job waits behind
# them (each check embeds up to 20,000 characters and every passage).
EDIT_CHECKS_KEY = "appliance:draft-checks:{owner}"
EDIT_CHECKS_HOLD_S = 600  # a worker lost mid-run (its message is then delivered again) holds no longer


def _enqueue_draft_check(owner_id: int, job_id, version: int) -> None:
    from inference.streaming import sync_client
    from inference.tasks import check_drafts

    key = EDIT_CHECKS_KEY.format(owner=owner_id)
    try:
        if not sync_client().set(key, "queued", nx=True, ex=EDIT_CHECKS_HOLD_S):
            return  # a check of this person's edits is queued or running: it takes this edit too
        check_drafts.apply_async(args=[owner_id], queue=celery_queue_for(Queue.DECODE))
    except PUBLISH_ERRORS:  # the edit is kept; the page says it could not be checked
        logger.warning("job %s: the broker did not take the check of edit %s", job_id, version)
        draft_check_failed(job_id=job_id, version=version)
        with contextlib.suppress(*PUBLISH_ERRORS):
            sync_client().delete(key)  # no check was queued: the next edit may queue one


def edits_to_check(owner_id: int) -> list[tuple[UUID, int]]:
    """(job id, edit version) of the person's edited drafts whose check is not stored yet,
    the oldest edit first."""
    waiting = Job.objects.filter(
        owner_id=owner_id, kind=JobKind.DRAFT, result_data__has_key="edited_text", result_data__edited_sentences=None
    )
    return [
        (pk, int(version))
        for pk, version in waiting.order_by("result_data__edited_at").values_list("pk", "result_data__edit_version")
    ]


def draft_checks_run(*, owner_id: int) -> int:
    """Check the person's edits that wait for their check, one after another (each once), then
    let their next edit queue a check again. Returns how many were checked."""
    from inference.streaming import sync_client

    key = EDIT_CHECKS_KEY.format(owner=owner_id)
    done: set[tuple[UUID, int]] = set()
    try:
        while waiting := [edit for edit in edits_to_check(owner_id) if edit not in done]:
            for job_id, version in waiting:
                done.add((job_id, version))
                sync_client().expire(key, EDIT_CHECKS_HOLD_S)
                draft_check_or_say_why_not(job_id=job_id, version=version)
    finally:
        sync_client().delete(key)
    # An edit saved after the last look and before the release queued nothing: queue it now.
    late = [edit for edit in edits_to_check(owner_id) if edit not in done]
    if late:
        _enqueue_draft_check(owner_id, *late[-1])
    return len(done)


def draft_check_edit(*, job_id, version: int) -> bool:
    """Check an edited draft's sentences against the passages of the job; stored only if no
    later edit came meanwhile. Runs in a decode worker."""
    from documents.embeddings import get_embedder  # heavy: loaded by the workers that check

    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return False
    draft = DraftResult.from_json(job.result_data)
    if draft.edited_text is None or draft.edit_version != version:
        return False
    # A passage whose document the author may no longer read (its share withdrawn since) is not
    # checked against: a citation of it is then one of a passage the draft does not have, rather
    # than a verdict and missing facts that would tell, edit after edit, what it says.
    readable = readable_ids(job.owner, [passage.document_id for passage in draft.passages])
    passages = [passage.numbered() for passage in draft.passages if passage.document_id in readable]
    checks = check_support(draft.edited_text, passages, embed=get_embedder().encode)
    return _store_edit_check(
        job_id, version, sentences=tuple(checks), support=Support.from_json(support_summary(checks))
    )


def draft_check_or_say_why_not(*, job_id, version: int) -> None:
    """``draft_check_edit``; if it breaks, the page says the check could not be made."""
    try:
        draft_check_edit(job_id=job_id, version=version)
    except Exception:
        logger.exception("job %s: the edited draft could not be checked", job_id)
        draft_check_failed(job_id=job_id, version=version)


def draft_check_failed(*, job_id, version: int) -> None:
    """The page stops saying "checking" and says the check could not be made."""
    _store_edit_check(job_id, version, sentences=(), support=Support(error=True))


def _store_edit_check(job_id, version: int, *, sentences: tuple[SentenceCheck, ...], support: Support) -> bool:
    """Store the check of edit ``version``, unless a later edit came meanwhile."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            return False
        draft = DraftResult.from_json(job.result_data)
        if draft.edit_version != version:
            return False
        job.result_data = replace(draft, edited_sentences=sentences, edited_support=support).to_json()
        job.save(update_fields=["result_data"])
    return True
