"""Writes for jobs: create, run (in a worker), cancel. Views, API and tasks call these."""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import timedelta

import redis
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from appliance.rendering import render_markdown
from documents.models import Document
from inference import running, streaming
from inference.clauses import DEFAULT_TAXONOMY, categories_for
from inference.drafting import MESSAGE_MAX_CHARS, check_support, support_summary
from inference.engine.client import EngineClient, EngineRequestError
from inference.grounding import ScopeRejected, draft_scope, passages_from_records
from inference.models import QUEUE_FOR_KIND, Job, JobKind, Queue, RequestMetrics
from inference.prompts import (
    DEFAULT_DRAFT_LENGTH,
    DEFAULT_DRAFT_TONE,
    DEFAULT_SUMMARY_LENGTH,
    DRAFT_LENGTHS,
    DRAFT_TONES,
    SUMMARY_LENGTHS,
)
from inference.timing import request_timing

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 4  # times a worker may start a job before it is failed (a job that kills workers)
CHAT_MAX_TOKENS_LIMIT = 4096
REGENERATE_TEMPERATURE = 0.7  # a regenerated draft samples, so that it can differ from the first
DRAFT_EDIT_MAX_CHARS = 20_000


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
    owner: AbstractBaseUser,
    document: Document,
    length: str = DEFAULT_SUMMARY_LENGTH,
    focus: str = "",
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    api_token=None,
) -> Job:
    """A summary on the prefill queue. ``max_tokens`` (at most the configured summary length)
    and ``ignore_eos`` let benchmarks fix the output length."""
    if document.state != Document.State.READY:
        raise JobRejected(
            "This document is not ready yet: its text is still being extracted, or extraction failed.",
            field="document_id",
        )
    if length not in SUMMARY_LENGTHS:
        raise JobRejected(
            f"Unknown summary length {length!r}; choose one of {', '.join(SUMMARY_LENGTHS)}.", field="length"
        )
    options: dict = {"length": length, "focus": focus[:500]}
    if max_tokens is not None:
        if not 1 <= max_tokens <= settings.APPLIANCE_SUMMARY_MAX_TOKENS:
            raise JobRejected(
                f"max_tokens must be between 1 and {settings.APPLIANCE_SUMMARY_MAX_TOKENS}.", field="max_tokens"
            )
        options["max_tokens"] = max_tokens
    if ignore_eos:
        options["ignore_eos"] = True
    return _job_create(owner=owner, document=document, kind=JobKind.SUMMARISE, options=options, api_token=api_token)


def job_create_clauses(
    *,
    owner: AbstractBaseUser,
    document: Document,
    taxonomy: str = DEFAULT_TAXONOMY,
    categories: list[str] | None = None,
    api_token=None,
) -> Job:
    """Clause extraction on the prefill queue: the categories of a named taxonomy (all of it, or
    those chosen)."""
    if document.state != Document.State.READY:
        raise JobRejected(
            "This document is not ready yet: its text is still being extracted, or extraction failed.",
            field="document_id",
        )
    try:
        chosen = categories_for(taxonomy, categories)
    except ValueError as exc:
        raise JobRejected(f"{exc}.", field="categories") from None
    options = {"taxonomy": taxonomy, "categories": list(chosen)}
    return _job_create(
        owner=owner, document=document, kind=JobKind.EXTRACT_CLAUSES, options=options, api_token=api_token
    )


def job_create_chat(
    *,
    owner: AbstractBaseUser,
    messages: list[dict[str, str]],
    max_tokens: int = 512,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: list[str] | tuple[str, ...] = (),
    frequency_penalty: float = 0.0,
    ignore_eos: bool = False,
    api_token=None,
) -> Job:
    """A chat completion on the decode queue: the OpenAI-compatible API and the benchmarks.
    ``top_p``, ``seed``, ``stop`` and ``frequency_penalty`` go to the engine as OpenAI defines
    them (``running.engine_request``)."""
    if not messages or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages):
        raise JobRejected("messages must be a non-empty list of {role, content} objects.", field="messages")
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
    options = {
        "messages": [{"role": str(m["role"]), "content": str(m["content"])} for m in messages],
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "ignore_eos": bool(ignore_eos),
    }
    # Only what differs from the engine's defaults, so that the jobs of the browser and the
    # benchmarks keep the options they always had.
    if top_p != 1.0:
        options["top_p"] = float(top_p)
    if seed is not None:
        options["seed"] = int(seed)
    if stop:
        options["stop"] = list(stop)
    if frequency_penalty:
        options["frequency_penalty"] = float(frequency_penalty)
    return _job_create(owner=owner, document=None, kind=JobKind.CHAT, options=options, api_token=api_token)


def job_create_draft(
    *,
    owner: AbstractBaseUser,
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
    try:
        scope = draft_scope(user=owner, document_ids=document_ids, group_id=group_id)
    except ScopeRejected as exc:
        raise JobRejected(str(exc), field=exc.field) from None
    options = {
        "message": message,
        "document_ids": list(scope.document_ids),
        "group_id": scope.group_id,
        "tone": tone,
        "length": length,
        "temperature": float(temperature),
    }
    if regenerated_from is not None:
        options["regenerated_from"] = str(regenerated_from.pk)
    # No ``document``: a draft rests on a scope, and deleting one of its documents must not delete
    # the reply (the passages it kept say which documents they came from).
    return _job_create(owner=owner, document=None, kind=JobKind.DRAFT, options=options, api_token=api_token)


def job_regenerate_draft(
    *, job: Job, user: AbstractBaseUser, tone: str | None = None, length: str | None = None
) -> Job:
    """A new draft for the same message and documents (tone and length may change), sampled so
    that it can differ from the one before."""
    if job.kind != JobKind.DRAFT:
        raise JobRejected("Only a drafted reply can be regenerated.")
    return _draft_again(
        job,
        owner=user,
        tone=tone or job.options["tone"],
        length=length or job.options["length"],
        temperature=REGENERATE_TEMPERATURE,
        regenerated_from=job,
    )


def _draft_again(job: Job, *, owner: AbstractBaseUser, **changes) -> Job:
    """A new draft with ``job``'s message, scope, tone, length and temperature, except ``changes``."""
    options = job.options
    request = {
        "message": options["message"],
        "document_ids": options.get("document_ids") or (),
        "group_id": options.get("group_id"),
        "tone": options["tone"],
        "length": options["length"],
        "temperature": float(options.get("temperature", 0.0)),
    }
    return job_create_draft(owner=owner, **{**request, **changes})


def draft_edit(*, job: Job, text: str) -> Job:
    """Keep the person's edits of a finished draft; the edited text is then checked against the
    same passages (``tasks.check_draft``, in a worker that has the embedder)."""
    if job.kind != JobKind.DRAFT or job.state != Job.State.SUCCEEDED:
        raise JobRejected("Only a finished draft can be edited.")
    text = (text or "").strip()
    if not text:
        raise JobRejected("The edited draft is empty.")
    if len(text) > DRAFT_EDIT_MAX_CHARS:
        raise JobRejected(f"The edited draft is longer than {DRAFT_EDIT_MAX_CHARS:,} characters.")
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        version = int(job.result_data.get("edit_version", 0)) + 1
        job.result_data = {
            **job.result_data,
            "edited_text": text,
            "edited_at": timezone.now().isoformat(),
            "edit_version": version,
            "edited_sentences": None,  # until the check below has run
            "edited_support": None,
        }
        job.save(update_fields=["result_data"])
        transaction.on_commit(lambda: _enqueue_draft_check(job.pk, version))
    return job


def _enqueue_draft_check(job_id, version: int) -> None:
    from inference.tasks import check_draft

    check_draft.apply_async(args=[str(job_id), version], queue=celery_queue_for(Queue.DECODE))


def draft_check_edit(*, job_id, version: int) -> bool:
    """Check an edited draft's sentences against the passages of the job; stored only if no
    later edit came meanwhile. Runs in a decode worker."""
    from documents.embeddings import get_embedder  # heavy: loaded by the workers that check

    job = Job.objects.filter(pk=job_id).first()
    if job is None or job.result_data.get("edit_version") != version:
        return False
    passages = passages_from_records(job.result_data.get("passages", []))
    checks = check_support(job.result_data["edited_text"], passages, embed=get_embedder().encode)
    return _store_edit_check(
        job_id, version, sentences=[asdict(check) for check in checks], support=support_summary(checks)
    )


def draft_check_failed(*, job_id, version: int) -> None:
    """The page stops saying "checking" and says the check could not be made."""
    _store_edit_check(job_id, version, sentences=[], support={"error": True})


def _store_edit_check(job_id, version: int, *, sentences: list, support: dict) -> bool:
    """Store the check of edit ``version``, unless a later edit came meanwhile."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.result_data.get("edit_version") != version:
            return False
        job.result_data = {**job.result_data, "edited_sentences": sentences, "edited_support": support}
        job.save(update_fields=["result_data"])
    return True


def job_retry(*, job: Job, user: AbstractBaseUser) -> Job:
    """A new job with the same request as a failed or cancelled one (checked again: the document
    must still be there, ready and readable, and the queue not full)."""
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
        )
    return job_create_clauses(
        owner=user, document=document, taxonomy=options["taxonomy"], categories=options.get("categories")
    )


def celery_queue_for(queue: Queue | str) -> str:
    """The Celery queue a job of this logical queue is sent to. Under ``fifo`` scheduling (a
    baseline for ``bench scheduling``) every job goes through one queue in arrival order."""
    if settings.APPLIANCE_SCHEDULING == "fifo":
        return str(Queue.PREFILL)
    return str(queue)


def _job_create(
    *, owner: AbstractBaseUser, document: Document | None, kind: JobKind, options: dict, api_token=None
) -> Job:
    queue = QUEUE_FOR_KIND[kind]
    waiting = Job.objects.filter(queue=queue, state=Job.State.QUEUED).count()
    if waiting >= settings.APPLIANCE_MAX_QUEUE_DEPTH:
        from inference.selectors import queue_eta_s

        retry_after = max(5, min(600, int(queue_eta_s(queue=queue, position=waiting) or 30)))
        raise QueueFull(
            f"The appliance is busy: {waiting} jobs are already waiting in the {queue} queue. "
            f"Try again in about {retry_after} seconds.",
            retry_after_s=retry_after,
        )
    with transaction.atomic():
        job = Job.objects.create(
            owner=owner, document=document, kind=kind, queue=queue, options=options, api_token=api_token
        )
        transaction.on_commit(lambda: job_enqueue(job_id=job.pk, queue=queue))
    return job


def job_enqueue(*, job_id, queue: Queue | str) -> None:
    from inference.tasks import run_job

    limit_s = settings.APPLIANCE_JOB_TIME_LIMIT_S
    run_job.apply_async(
        args=[str(job_id)], queue=celery_queue_for(queue), soft_time_limit=limit_s, time_limit=limit_s + 30
    )


def job_requeue(*, job_id) -> bool:
    """The engine host is down: put a running job back in the queued state while its task
    waits to retry. The attempt does not count against ``MAX_ATTEMPTS``: the job did nothing
    wrong, and the retry window bounds the wait."""
    updated = Job.objects.filter(pk=job_id, state=Job.State.RUNNING).update(
        state=Job.State.QUEUED, heartbeat_at=None, attempts=Greatest(F("attempts") - 1, 0)
    )
    if updated:
        streaming.publish(job_id, "waiting", {"reason": "engine_unavailable", "position": None})
    return bool(updated)


def jobs_recover_stale() -> tuple[int, int]:
    """Jobs whose worker stopped reporting (killed, machine lost) go back to their queue, or fail
    with a reason once they have been started ``MAX_ATTEMPTS`` times. Returns (requeued, failed).

    Run by every inference worker when it starts and then periodically (``tasks.py``). The broker
    would redeliver the task itself only after its visibility timeout, hours later; if it does,
    the job is finished by then (or running again) and the redelivered task does nothing."""
    cutoff = timezone.now() - timedelta(seconds=settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S)
    requeued = failed = 0
    stale = Job.objects.filter(state=Job.State.RUNNING).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at=None, started_at__lt=cutoff)
    )
    for job in stale.only("pk", "queue", "attempts", "heartbeat_at"):
        if job.attempts >= MAX_ATTEMPTS:
            job_fail(
                job_id=job.pk,
                reason=f"The worker running this job stopped {job.attempts} times, so it was given up. "
                "The administrator can find why in the logs.",
            )
            failed += 1
            continue
        # Conditional on the heartbeat seen, so that two workers never both re-send it.
        if Job.objects.filter(pk=job.pk, state=Job.State.RUNNING, heartbeat_at=job.heartbeat_at).update(
            state=Job.State.QUEUED, heartbeat_at=None
        ):
            logger.warning("job %s: its worker stopped reporting; sending it to the %s queue again", job.pk, job.queue)
            streaming.publish(job.pk, "waiting", {"reason": "worker_lost", "position": None})
            job_enqueue(job_id=job.pk, queue=job.queue)
            requeued += 1
    return requeued, failed


def job_cancel(*, job: Job) -> bool:
    """Cancel a job that has not finished. A running job's engine request is aborted by its
    worker within a fraction of a second, which frees its KV reservation."""
    updated = (
        Job.objects.filter(pk=job.pk)
        .exclude(state__in=Job.FINISHED_STATES)
        .update(state=Job.State.CANCELLED, finished_at=timezone.now())
    )
    if updated:
        try:
            streaming.request_cancel(job.pk)
            streaming.publish(job.pk, "cancelled", {"detail": "Cancelled."})
        except redis.RedisError:
            # The row says cancelled; a worker that cannot see the flag finds it when it stores
            # the result (only a RUNNING job is marked done) and the text is dropped.
            logger.warning("job %s: cancelled, but the broker could not be told", job.pk, exc_info=True)
    return bool(updated)


def job_fail(*, job_id, reason: str) -> None:
    updated = (
        Job.objects.filter(pk=job_id)
        .exclude(state__in=Job.FINISHED_STATES)
        .update(state=Job.State.FAILED, error=reason, finished_at=timezone.now())
    )
    if updated:
        streaming.publish(job_id, "failed", {"detail": reason})


def job_run(*, job_id, client: EngineClient | None = None) -> Job | None:
    """Run one job through the engine host, streaming its text, then store result and metrics.

    Safe to call again for the same job (a redelivered task): a finished job is left alone and an
    unfinished one starts over. ``EngineUnavailable`` propagates so that the task can retry."""
    job = Job.objects.select_related("document", "owner").filter(pk=job_id).first()
    if job is None or job.is_finished:
        return job  # a job whose row is gone is dropped quietly
    client = client or EngineClient.from_settings()
    started = timezone.now()
    # Claim it: queued, or running under a worker that stopped reporting (it died and the broker
    # handed the task on). A job another worker is running is left alone.
    stale = started - timedelta(seconds=settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S)
    claimed = (
        Job.objects.filter(pk=job.pk)
        .filter(
            Q(state=Job.State.QUEUED)
            | Q(state=Job.State.RUNNING, heartbeat_at__lt=stale)
            | Q(state=Job.State.RUNNING, heartbeat_at=None)
        )
        .update(
            state=Job.State.RUNNING,
            started_at=Coalesce(F("started_at"), started),
            attempts=F("attempts") + 1,
            heartbeat_at=started,
        )
    )
    if not claimed:  # cancelled, finished or running elsewhere since it was fetched
        return Job.objects.get(pk=job.pk)
    started_before = job.started_at is not None
    job.refresh_from_db(fields=["state", "started_at", "attempts"])
    if started_before:  # whatever an earlier attempt streamed is replaced
        streaming.publish(job.pk, "restart", {"attempt": job.attempts})

    runner = running.RUNNERS.get(JobKind(job.kind))
    if runner is None:
        job_fail(job_id=job.pk, reason=f"{job.get_kind_display()} is not available yet.")
        return Job.objects.get(pk=job.pk)
    try:
        result = runner(job, client)
    except EngineRequestError as exc:
        job_fail(job_id=job.pk, reason=f"The engine refused this job: {exc.detail}")
        return Job.objects.get(pk=job.pk)
    except ValueError as exc:
        job_fail(job_id=job.pk, reason=str(exc))
        return Job.objects.get(pk=job.pk)

    if result.cancelled:
        return Job.objects.get(pk=job.pk)
    with transaction.atomic():
        updated = Job.objects.filter(pk=job.pk, state=Job.State.RUNNING).update(
            state=Job.State.SUCCEEDED,
            result_text=result.text.strip(),
            result_note=result.note,
            result_data=result.data,
            finished_at=timezone.now(),
        )
        if not updated:  # cancelled while the last tokens arrived
            return Job.objects.get(pk=job.pk)
        RequestMetrics.objects.update_or_create(job=job, defaults=_metrics_fields(job, result))
    job = Job.objects.select_related("metrics").get(pk=job.pk)
    streaming.publish(job.pk, "done", metrics_summary(job))
    return job


def _metrics_fields(job: Job, result: running.TaskResult) -> dict:
    """One row per job: latency from the request the user watched (or the first), tokens and
    prefill time summed over every engine request the job made."""
    source = running.timing_source(result)
    timing = request_timing(
        created_at=job.created_at.timestamp(), started_at=job.started_at.timestamp(), deltas=source.deltas
    )
    runs = result.runs
    prefills = [run.done.get("prefill_ms") for run in runs if run.done.get("prefill_ms") is not None]
    return {
        "queue": job.queue,
        "engine": source.admitted.get("engine", ""),
        "model": source.admitted.get("model", ""),
        "scheduling": source.admitted.get("scheduling", ""),
        "prefill_ms": sum(prefills) if prefills else None,
        "queue_wait_ms": timing.queue_wait_ms,
        "admission_wait_ms": sum(float(run.admitted.get("admission_wait_ms", 0.0)) for run in runs),
        "ttft_ms": timing.ttft_ms if timing.ttft_ms is not None else 0.0,
        "itl_mean_ms": timing.itl_mean_ms,
        "itl_p95_ms": timing.itl_p95_ms,
        "prompt_tokens": sum(int(run.done.get("prompt_tokens", run.admitted.get("prompt_tokens", 0))) for run in runs),
        "cached_prompt_tokens": sum(int(run.done.get("cached_prompt_tokens", 0)) for run in runs),
        "output_tokens": sum(int(run.done.get("output_tokens", len(run.deltas))) for run in runs),
        "decode_tokens_per_s": timing.decode_tokens_per_s,
        "kv_reservation_tokens": max(int(run.admitted.get("kv_reservation_tokens", 0)) for run in runs),
        "preemptions": sum(int(run.done.get("preemptions", 0)) for run in runs),
        "engine_requests": len(runs),
    }


def metrics_summary(job: Job) -> dict:
    metrics = getattr(job, "metrics", None)
    statements = job.result_data.get("statements") if job.kind == JobKind.SUMMARISE else None
    html = render_markdown(job.result_text)  # the page swaps the streamed text for this
    if metrics is None:
        return {"note": job.result_note, "statements": statements, "html": html}
    return {
        "note": job.result_note,
        "statements": statements,
        "html": html,
        "ttft_ms": round(metrics.ttft_ms, 1),
        "queue_wait_ms": round(metrics.queue_wait_ms, 1),
        "prompt_tokens": metrics.prompt_tokens,
        "output_tokens": metrics.output_tokens,
        "decode_tokens_per_s": round(metrics.decode_tokens_per_s, 1) if metrics.decode_tokens_per_s else None,
    }
