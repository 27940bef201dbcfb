"""Writes for jobs of every kind: create (with the queue's and the person's caps), retry, cancel."""

from __future__ import annotations

import logging

import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from appliance.broker import PUBLISH_ERRORS, BrokerUnavailable, broker_check
from documents.models import Document
from inference import streaming
from inference.clauses import DEFAULT_TAXONOMY, categories_for
from inference.job_options import ChatOptions, ClauseOptions, SummaryOptions, storable
from inference.lifecycle import celery_queue_for, job_dispatch, startable, take_claim_turn
from inference.models import QUEUE_FOR_KIND, Job, JobKind, Queue
from inference.prompts import (
    DEFAULT_SUMMARY_LENGTH,
    SUMMARY_LENGTHS,
)
from inference.sampling import NO_EXTRAS, SamplingExtras
from inference.structured import schema_problem

logger = logging.getLogger(__name__)


CHAT_MAX_TOKENS_LIMIT = 4096


CHAT_MAX_MESSAGES = 256  # a conversation's turns; its words are bounded by the request body's limit


class JobRejected(ValueError):
    """The job cannot be created; the message is for the user, ``field`` the input it is about."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class QueueFull(JobRejected):
    """Too many jobs wait in this queue already: try again after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def job_create_summary(
    *,
    owner: User,
    document: Document,
    length: str = DEFAULT_SUMMARY_LENGTH,
    focus: str = "",
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    api_token=None,
    checkpoint: dict | None = None,
) -> Job:
    """A summary on the prefill queue. ``max_tokens`` (at most the configured summary length)
    and ``ignore_eos`` let benchmarks fix the output length; ``checkpoint``, the finished parts
    of a job tried again (``job_retry``)."""
    if document.state != Document.State.READY:
        raise JobRejected(
            "This document is not ready yet: its text is still being extracted, or extraction failed.",
            field="document_id",
        )
    if length not in SUMMARY_LENGTHS:
        raise JobRejected(
            f"Unknown summary length {length!r}; choose one of {', '.join(SUMMARY_LENGTHS)}.", field="length"
        )
    if max_tokens is not None and not 1 <= max_tokens <= settings.APPLIANCE_SUMMARY_MAX_TOKENS:
        raise JobRejected(
            f"max_tokens must be between 1 and {settings.APPLIANCE_SUMMARY_MAX_TOKENS}.", field="max_tokens"
        )
    options = SummaryOptions(length=length, focus=focus[:500], max_tokens=max_tokens, ignore_eos=bool(ignore_eos))
    return _job_create(
        owner=owner,
        document=document,
        kind=JobKind.SUMMARISE,
        options=options.to_json(),
        api_token=api_token,
        checkpoint=checkpoint,
    )


def job_create_clauses(
    *,
    owner: User,
    document: Document,
    taxonomy: str = DEFAULT_TAXONOMY,
    categories: list[str] | None = None,
    api_token=None,
    checkpoint: dict | None = None,
) -> Job:
    """Clause extraction on the prefill queue: the categories of a named taxonomy (all of it, or
    those chosen); ``checkpoint``, the finished parts of a job tried again (``job_retry``)."""
    if document.state != Document.State.READY:
        raise JobRejected(
            "This document is not ready yet: its text is still being extracted, or extraction failed.",
            field="document_id",
        )
    try:
        chosen = categories_for(taxonomy, categories)
    except ValueError as exc:
        raise JobRejected(f"{exc}.", field="categories") from None
    options = ClauseOptions(taxonomy=taxonomy, categories=tuple(chosen))
    return _job_create(
        owner=owner,
        document=document,
        kind=JobKind.EXTRACT_CLAUSES,
        options=options.to_json(),
        api_token=api_token,
        checkpoint=checkpoint,
    )


def job_create_chat(
    *,
    owner: User,
    messages: list[dict[str, str]] | None = None,
    prompt: str | None = None,
    max_tokens: int = 512,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: list[str] | tuple[str, ...] = (),
    frequency_penalty: float = 0.0,
    extras: SamplingExtras = NO_EXTRAS,
    json_schema: dict | None = None,
    ignore_eos: bool = False,
    api_token=None,
    claim_for: str = "",
) -> Job:
    """A chat completion on the decode queue: the OpenAI-compatible API and the benchmarks.
    ``messages`` are read in the model's chat template; a ``prompt`` instead (``/v1/completions``)
    is continued as written, and its answer kept verbatim, whitespace and all. ``top_p``,
    ``seed``, ``stop`` and ``frequency_penalty`` go to the engine as OpenAI defines them
    (``running.engine_request``), and ``extras`` (OpenAI's ``presence_penalty`` and
    ``logit_bias``, vLLM's ``top_k``, ``min_p``, ``repetition_penalty`` and ``min_tokens``) as
    vLLM does. With a ``json_schema`` the engine lets the model write only an answer that
    matches it.
    ``claim_for``: an engine's key (``lifecycle.this_engine``) when the caller would run the job
    itself on that engine: if the queue would start it now anyway, it is created claimed
    (running, attempt 1, no message sent) and the caller runs it (``lifecycle.job_run_claimed``);
    otherwise it is queued as any other."""
    if prompt is not None:
        if messages:
            raise JobRejected("send either messages or a prompt, not both.", field="prompt")
        if not isinstance(prompt, str) or not prompt:
            raise JobRejected("prompt must be a non-empty text.", field="prompt")
        messages = []
    elif not messages or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages):
        raise JobRejected("messages must be a non-empty list of {role, content} objects.", field="messages")
    if len(messages) > CHAT_MAX_MESSAGES:
        raise JobRejected(f"at most {CHAT_MAX_MESSAGES} messages are accepted in one request.", field="messages")
    if any(m["role"] not in {"system", "user", "assistant"} for m in messages):
        raise JobRejected("a message's role must be system, user or assistant.", field="messages")
    if not 1 <= max_tokens <= CHAT_MAX_TOKENS_LIMIT:
        raise JobRejected(f"max_tokens must be between 1 and {CHAT_MAX_TOKENS_LIMIT}.", field="max_tokens")
    if not 0.0 <= temperature <= 2.0:
        raise JobRejected("temperature must be between 0 and 2.", field="temperature")
    if not 0.0 < top_p <= 1.0:
        raise JobRejected("top_p must be greater than 0 and at most 1.", field="top_p")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63):
        raise JobRejected("seed must be a whole number that fits in 64 bits.", field="seed")
    if isinstance(stop, str) or not all(isinstance(s, str) and 0 < len(s) <= 256 for s in stop):
        raise JobRejected("stop must be a list of non-empty strings of at most 256 characters each.", field="stop")
    if len(stop) > 4:
        raise JobRejected("stop may hold at most 4 sequences.", field="stop")
    if not -2.0 <= frequency_penalty <= 2.0:
        raise JobRejected("frequency_penalty must be between -2 and 2.", field="frequency_penalty")
    problem = extras.problem(max_tokens)
    if problem:
        raise JobRejected(problem[1], field=problem[0])
    refused = None if json_schema is None else schema_problem(json_schema)
    if refused:
        raise JobRejected(refused, field="json_schema")
    options = ChatOptions(
        messages=tuple({"role": str(m["role"]), "content": str(m["content"])} for m in messages),
        max_tokens=int(max_tokens),
        temperature=float(temperature),
        ignore_eos=bool(ignore_eos),
        top_p=float(top_p),
        seed=None if seed is None else int(seed),
        stop=tuple(stop),
        frequency_penalty=float(frequency_penalty),
        prompt=prompt or "",
        extras=extras,
        json_schema=json_schema,
    )
    return _job_create(
        owner=owner,
        document=None,
        kind=JobKind.CHAT,
        options=options.to_json(),
        api_token=api_token,
        claim_for=claim_for,
    )


def _job_create(
    *,
    owner: User,
    document: Document | None,
    kind: JobKind,
    options: dict,
    api_token=None,
    checkpoint: dict | None = None,
    claim_for: str = "",
) -> Job:
    """Write the job and send it to its queue after the commit. Refused before anything is
    written when its queue is full, when its owner has as many jobs waiting there as one person
    may, or when the broker does not answer (``BrokerUnavailable``: the API and the pages answer
    503 with ``Retry-After``). If the publish still fails after the commit, the row is removed,
    so that no queued job is left that nothing will run. ``claim_for``: see ``job_create_chat``."""
    queue = QUEUE_FOR_KIND[kind]
    _check_queue_depth(queue)
    _check_owner_queued(owner, queue)  # a 429 says what to do better than a 503 would
    broker_check()
    with transaction.atomic():
        # Counted again, with one person's jobs counted and written one request at a time, so
        # that a burst of requests cannot slip past the per-person limit together.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"inference.create:{owner.pk}"])
        _check_owner_queued(owner, queue)
        celery_queue = celery_queue_for(queue)
        claimed = bool(claim_for) and _would_start_now(celery_queue)
        now = timezone.now()
        job = Job.objects.create(
            owner=owner,
            document=document,
            kind=kind,
            queue=queue,
            celery_queue=celery_queue,
            options=storable(options),
            api_token=api_token,
            checkpoint=checkpoint or {},
            **(
                {"state": Job.State.RUNNING, "attempts": 1, "engine": claim_for, "started_at": now,
                 "claimed_at": now, "heartbeat_at": now}
                if claimed
                else {}
            ),
        )  # fmt: skip
        if not claimed:
            transaction.on_commit(lambda: _dispatch_new(job.pk, job.celery_queue))
    return job


def _would_start_now(celery_queue: str) -> bool:
    """Whether a job of ``celery_queue`` (the decode queue's: its creator may run a ``/v1``
    chat itself) would be claimed at once if it were sent there: nobody waits ahead of it, and
    fewer of the queue's jobs run than its workers have threads. Decided in the queue's claim
    turn (the lock workers' claims take), so it is counted with theirs."""
    if celery_queue != Queue.DECODE:
        return False
    take_claim_turn(celery_queue)
    running = Job.objects.filter(celery_queue=celery_queue, state=Job.State.RUNNING)
    return not startable(celery_queue=celery_queue).exists() and running.count() < settings.APPLIANCE_DECODE_CONCURRENCY


def _retry_after_s(queue: str, position: int) -> int:
    from inference.selectors import queue_eta_s

    return max(5, min(600, int(queue_eta_s(queue=queue, position=position) or 30)))


def _check_queue_depth(queue: str) -> None:
    waiting = Job.objects.filter(queue=queue, state=Job.State.QUEUED).count()
    if waiting >= settings.APPLIANCE_MAX_QUEUE_DEPTH:
        retry_after = _retry_after_s(queue, waiting)
        raise QueueFull(
            f"The appliance is busy: {waiting} jobs are already waiting in the {queue} queue. "
            f"Try again in about {retry_after} seconds.",
            retry_after_s=retry_after,
        )


def _check_owner_queued(owner: User, queue: str) -> None:
    limit = settings.APPLIANCE_MAX_QUEUED_PER_USER
    if not limit:
        return
    mine = Job.objects.filter(owner=owner, queue=queue, state=Job.State.QUEUED).count()
    if mine >= limit:
        # Users take turns, so one of theirs starts within about one turn of the queue.
        retry_after = _retry_after_s(queue, 1)
        raise QueueFull(
            f"You already have {mine} jobs waiting in the {queue} queue, the most one person may have "
            f"waiting at once ({limit}), so that others are not kept waiting. Try again in about "
            f"{retry_after} seconds, when some of yours have started.",
            retry_after_s=retry_after,
        )


def _dispatch_new(job_id, celery_queue: str) -> None:
    try:
        job_dispatch(job_id=job_id, celery_queue=celery_queue)
    except PUBLISH_ERRORS as exc:
        # The broker went away after the check: take the row back rather than leave it queued.
        Job.objects.filter(pk=job_id, state=Job.State.QUEUED, dispatched_at=None).delete()
        logger.warning("job %s: the broker did not take its message; the job was removed", job_id)
        raise BrokerUnavailable() from exc


def job_cancel(*, job: Job) -> bool:
    """Cancel a job that has not finished. A running job's attempt loses its fence at once, so it
    writes nothing more to the stream, and its engine request is aborted within a fraction of a
    second, which frees its KV reservation."""
    updated = (
        Job.objects.filter(pk=job.pk)
        .exclude(state__in=Job.FINISHED_STATES)
        .update(state=Job.State.CANCELLED, finished_at=timezone.now())  # its checkpoint stays, for a retry
    )
    if updated:
        try:
            streaming.fence_release(job.pk)
            streaming.request_cancel(job.pk)
            streaming.publish(job.pk, "cancelled", {"detail": "Cancelled."})
        except redis.RedisError:
            # The row says cancelled; a worker that cannot see the flag finds it at its next
            # heartbeat or when it stores the result (only a RUNNING job is marked done).
            logger.warning("job %s: cancelled, but the broker could not be told", job.pk, exc_info=True)
    return bool(updated)
