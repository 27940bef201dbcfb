"""Writes for jobs: create, run (in a worker), cancel. Views, API and tasks call these."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from documents.models import Document
from inference import streaming
from inference.engine.client import EngineClient, EngineRequestError
from inference.engine.protocol import GenerateRequest, Priority
from inference.models import QUEUE_FOR_KIND, Job, JobKind, Queue, RequestMetrics
from inference.prompts import DEFAULT_SUMMARY_LENGTH, SUMMARY_LENGTHS, PageText
from inference.summarise import plan_summary
from inference.timing import Delta, request_timing

logger = logging.getLogger(__name__)

PRIORITY_FOR_QUEUE = {Queue.PREFILL: Priority.PREFILL, Queue.DECODE: Priority.DECODE}
CANCEL_CHECK_INTERVAL_S = 0.25


class JobRejected(ValueError):
    """The job cannot be created; the message is for the user."""


def job_create_summary(*, owner: AbstractBaseUser, document: Document, length: str = DEFAULT_SUMMARY_LENGTH, focus: str = "") -> Job:
    if document.state != Document.State.READY:
        raise JobRejected("This document is not ready yet: its text is still being extracted, or extraction failed.")
    if length not in SUMMARY_LENGTHS:
        raise JobRejected(f"Unknown summary length {length!r}; choose one of {', '.join(SUMMARY_LENGTHS)}.")
    return _job_create(owner=owner, document=document, kind=JobKind.SUMMARISE, options={"length": length, "focus": focus[:500]})


def _job_create(*, owner: AbstractBaseUser, document: Document | None, kind: JobKind, options: dict) -> Job:
    from inference.tasks import run_job

    queue = QUEUE_FOR_KIND[kind]
    with transaction.atomic():
        job = Job.objects.create(owner=owner, document=document, kind=kind, queue=queue, options=options)
        limit_s = settings.APPLIANCE_JOB_TIME_LIMIT_S
        transaction.on_commit(
            lambda: run_job.apply_async(
                args=[str(job.pk)], queue=str(queue), soft_time_limit=limit_s, time_limit=limit_s + 30
            )
        )
    return job


def job_cancel(*, job: Job) -> bool:
    """Cancel a job that has not finished. A running job's engine request is aborted by its
    worker within a fraction of a second, which frees its KV reservation."""
    updated = Job.objects.filter(pk=job.pk).exclude(state__in=Job.FINISHED_STATES).update(
        state=Job.State.CANCELLED, finished_at=timezone.now()
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
    updated = Job.objects.filter(pk=job_id).exclude(state__in=Job.FINISHED_STATES).update(
        state=Job.State.FAILED, error=reason, finished_at=timezone.now()
    )
    if updated:
        streaming.publish(job_id, "failed", {"detail": reason})


@dataclass
class EngineRun:
    text: str = ""
    deltas: list[Delta] = field(default_factory=list)
    admitted: dict = field(default_factory=dict)
    done: dict = field(default_factory=dict)
    cancelled: bool = False


def _run_engine(job: Job, request: GenerateRequest, client: EngineClient) -> EngineRun:
    run = EngineRun()
    parts: list[str] = []
    next_cancel_check = 0.0
    events = client.generate(request, idle_timeout_s=settings.APPLIANCE_JOB_TIME_LIMIT_S)
    try:
        for event in events:
            if event.type == "admitted":
                run.admitted = event.data
            elif event.type == "delta":
                parts.append(event.data["text"])
                run.deltas.append(Delta(at=event.received_at, tokens=int(event.data.get("tokens", 0))))
                streaming.publish(job.pk, "delta", {"text": event.data["text"]})
            elif event.type == "done":
                run.done = event.data
            if event.received_at >= next_cancel_check:
                next_cancel_check = event.received_at + CANCEL_CHECK_INTERVAL_S
                if streaming.cancel_requested(job.pk):
                    run.cancelled = True
                    break  # closing the stream makes the engine host abort the request
    finally:
        events.close()
    run.text = "".join(parts)
    return run


def _summary_request(job: Job, client: EngineClient) -> tuple[GenerateRequest, str]:
    document = job.document
    pages = [PageText(p.number, p.text) for p in document.pages.order_by("number").only("number", "text")]
    max_tokens = settings.APPLIANCE_SUMMARY_MAX_TOKENS
    context = int(client.stats()["max_model_len"])
    plan = plan_summary(
        title=document.title,
        pages=pages,
        length=job.options.get("length", DEFAULT_SUMMARY_LENGTH),
        focus=job.options.get("focus", ""),
        context_tokens=context,
        max_output_tokens=max_tokens,
        count_tokens=lambda messages: client.count_tokens([messages])[0],
    )
    request = GenerateRequest(
        request_id=f"{job.pk}-{job.attempts}",
        messages=plan.messages,
        max_tokens=max_tokens,
        priority=PRIORITY_FOR_QUEUE[Queue(job.queue)],
        queue=job.queue,
    )
    return request, plan.note


def job_run(*, job_id, client: EngineClient | None = None) -> Job | None:
    """Run one job through the engine host, streaming its text, then store result and metrics.

    Safe to call again for the same job (a redelivered task): a finished job is left alone and an
    unfinished one starts over. ``EngineUnavailable`` propagates so that the task can retry."""
    job = Job.objects.select_related("document").filter(pk=job_id).first()
    if job is None or job.is_finished:
        return job
    client = client or EngineClient.from_settings()
    started = timezone.now()
    claimed = (
        Job.objects.filter(pk=job.pk)
        .exclude(state__in=Job.FINISHED_STATES)
        .update(state=Job.State.RUNNING, started_at=Coalesce(F("started_at"), started), attempts=F("attempts") + 1)
    )
    if not claimed:  # cancelled (or finished) since it was fetched
        return Job.objects.get(pk=job.pk)
    job.refresh_from_db(fields=["state", "started_at", "attempts"])
    if job.attempts > 1:
        streaming.publish(job.pk, "restart", {"attempt": job.attempts})

    if job.kind != JobKind.SUMMARISE:
        job_fail(job_id=job.pk, reason=f"{job.get_kind_display()} is not available yet.")
        return Job.objects.get(pk=job.pk)
    try:
        request, note = _summary_request(job, client)
        run = _run_engine(job, request, client)
    except EngineRequestError as exc:
        job_fail(job_id=job.pk, reason=f"The engine refused this job: {exc.detail}")
        return Job.objects.get(pk=job.pk)
    except ValueError as exc:
        job_fail(job_id=job.pk, reason=str(exc))
        return Job.objects.get(pk=job.pk)

    if run.cancelled:
        return Job.objects.get(pk=job.pk)
    timing = request_timing(
        created_at=job.created_at.timestamp(), started_at=job.started_at.timestamp(), deltas=run.deltas
    )
    with transaction.atomic():
        updated = Job.objects.filter(pk=job.pk, state=Job.State.RUNNING).update(
            state=Job.State.SUCCEEDED, result_text=run.text.strip(), result_note=note, finished_at=timezone.now()
        )
        if not updated:  # cancelled while the last tokens arrived
            return Job.objects.get(pk=job.pk)
        RequestMetrics.objects.update_or_create(
            job=job,
            defaults={
                "queue": job.queue,
                "engine": run.admitted.get("engine", ""),
                "model": run.admitted.get("model", ""),
                "queue_wait_ms": timing.queue_wait_ms,
                "admission_wait_ms": float(run.admitted.get("admission_wait_ms", 0.0)),
                "ttft_ms": timing.ttft_ms if timing.ttft_ms is not None else 0.0,
                "itl_mean_ms": timing.itl_mean_ms,
                "itl_p95_ms": timing.itl_p95_ms,
                "prompt_tokens": int(run.done.get("prompt_tokens", run.admitted.get("prompt_tokens", 0))),
                "cached_prompt_tokens": int(run.done.get("cached_prompt_tokens", 0)),
                "output_tokens": int(run.done.get("output_tokens", timing.output_tokens)),
                "decode_tokens_per_s": timing.decode_tokens_per_s,
                "kv_reservation_tokens": int(run.admitted.get("kv_reservation_tokens", 0)),
                "preemptions": int(run.done.get("preemptions", 0)),
            },
        )
    job = Job.objects.select_related("metrics").get(pk=job.pk)
    streaming.publish(job.pk, "done", metrics_summary(job))
    return job


def metrics_summary(job: Job) -> dict:
    metrics = getattr(job, "metrics", None)
    if metrics is None:
        return {"note": job.result_note}
    return {
        "note": job.result_note,
        "ttft_ms": round(metrics.ttft_ms, 1),
        "queue_wait_ms": round(metrics.queue_wait_ms, 1),
        "prompt_tokens": metrics.prompt_tokens,
        "output_tokens": metrics.output_tokens,
        "decode_tokens_per_s": round(metrics.decode_tokens_per_s, 1) if metrics.decode_tokens_per_s else None,
    }
