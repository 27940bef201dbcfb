"""Reads for jobs, filtered by owner (and by who may read their document) in the query itself."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, overload

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Max, Q, Sum
from django.utils import timezone

from documents.selectors import readable_filter
from inference.fairshare import Waiting, claim_order
from inference.models import Job, Queue, RequestMetrics

ETA_WINDOW = timedelta(hours=1)


def _visible_jobs(user: User):
    """The user's jobs whose document, if they have one, the user may still read: once a share is
    withdrawn, a summary's text and a clause job's quotes are the document's words, and are
    withheld with it (the job is kept, and shown again if the document is shared again)."""
    readable = readable_filter(user, document_field="document_id", owner_field="document__owner")
    return Job.objects.filter(owner=user).filter(Q(document__isnull=True) | readable)


def job_for_user(*, user: User, job_id) -> Job | None:
    if not user.is_authenticated:
        return None
    return _visible_jobs(user).select_related("document", "metrics").filter(pk=job_id).first()


def jobs_of(*, user: User):
    """The user's jobs, newest first."""
    if not user.is_authenticated:
        return Job.objects.none()
    return _visible_jobs(user).select_related("document", "metrics").order_by("-created_at")


async def ajob_for_user(*, user: User, job_id) -> Job | None:
    if not user.is_authenticated:
        return None
    return await _visible_jobs(user).select_related("document").filter(pk=job_id).afirst()


def queue_concurrency(queue: Queue | str) -> int:
    return {
        Queue.PREFILL: settings.APPLIANCE_PREFILL_CONCURRENCY,
        Queue.DECODE: settings.APPLIANCE_DECODE_CONCURRENCY,
    }[Queue(queue)]


def _celery_queue(job: Job) -> str:
    from inference.lifecycle import celery_queue_for

    return job.celery_queue or celery_queue_for(job.queue)


def queue_positions(*, celery_queue: str) -> dict:
    """1-based place of each queued job of a Celery queue, in the order workers will start them:
    fair share between owners (``inference.fairshare``), as ``lifecycle.job_claim_next`` claims."""
    queued = Job.objects.filter(celery_queue=celery_queue, state=Job.State.QUEUED).order_by()
    waiting = [Waiting(pk, owner, created) for pk, owner, created in queued.values_list("pk", "owner_id", "created_at")]
    owners = {job.owner_id for job in waiting}
    mine = Job.objects.filter(celery_queue=celery_queue, owner_id__in=owners).order_by()
    running = dict(
        mine.filter(state=Job.State.RUNNING).values("owner_id").annotate(n=Count("pk")).values_list("owner_id", "n")
    )
    served = dict(
        mine.filter(claimed_at__isnull=False)
        .values("owner_id")
        .annotate(last=Max("claimed_at"))
        .values_list("owner_id", "last")
    )
    order = claim_order(waiting, running=running, last_served=served)
    return {job_id: place for place, job_id in enumerate(order, start=1)}


def queue_position(job: Job, *, orders: dict | None = None) -> int:
    """1-based place of a queued job in its queue (the order workers take them); 0 once it has
    started. ``orders``: a dict kept across the jobs of one page, so that each queue's order is
    worked out once for all of them rather than once per row."""
    if job.state != Job.State.QUEUED:
        return 0
    orders = {} if orders is None else orders
    queue = _celery_queue(job)
    if queue not in orders:
        orders[queue] = queue_positions(celery_queue=queue)
    return orders[queue].get(job.pk, 1)


def queue_eta_s(*, queue: Queue | str, position: int, memo: dict | None = None) -> float | None:
    """Seconds until a job at ``position`` finishes, from how long this queue's jobs took in the
    last hour and how many run at once; None before any job of the queue has finished.
    ``memo``: a dict kept across the jobs of one page (each queue's mean is read once)."""
    memo = {} if memo is None else memo
    key = ("mean_duration", str(queue))
    if key not in memo:
        since = timezone.now() - ETA_WINDOW
        memo[key] = (
            Job.objects.filter(queue=queue, state=Job.State.SUCCEEDED, finished_at__gte=since, started_at__isnull=False)
            .annotate(took=ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField()))
            .aggregate(mean=Avg("took"))["mean"]
        )
    duration = memo[key]
    if duration is None:
        return None
    rounds = -(-max(position, 1) // queue_concurrency(queue))  # ceil: jobs run in rounds of the cap
    return round(rounds * duration.total_seconds(), 1)


def job_queue_status(job: Job, *, orders: dict | None = None) -> dict:
    position = queue_position(job, orders=orders)
    eta = queue_eta_s(queue=job.queue, position=position, memo=orders) if position else None
    return {"position": position, "eta_s": eta}


@sync_to_async
def ajob_queue_status(*, job_id) -> dict | None:
    job = Job.objects.filter(pk=job_id).only("pk", "queue", "celery_queue", "state", "created_at").first()
    if job is None:
        return None
    return {"state": job.state, **job_queue_status(job)}


# --- usage ---------------------------------------------------------------------------------------

USAGE_TOKENS = ("engine_requests", "prompt_tokens", "output_tokens")


@overload
def usage(*, since: datetime, owner: User | None = None, group: None = None) -> dict[str, Any]: ...
@overload
def usage(*, since: datetime, owner: User | None = None, group: str) -> list[dict[str, Any]]: ...
def usage(
    *, since: datetime, owner: User | None = None, group: str | None = None
) -> dict[str, Any] | list[dict[str, Any]]:
    """Usage over a window, with one meaning wherever it is shown (the API, the console): ``jobs``
    are the jobs asked for since ``since`` (created then, chat completions included, whatever
    became of them), and the engine requests and tokens are those their runs used. ``owner``:
    one person's only. ``group``: a Job field path (``kind``, ``api_token``,
    ``owner__username``), one row per value, most output tokens first; else one total."""
    jobs = Job.objects.filter(created_at__gte=since)
    if owner is not None:
        jobs = jobs.filter(owner=owner)
    metrics = RequestMetrics.objects.filter(job__in=jobs)
    tokens = {name: Sum(name) for name in USAGE_TOKENS}
    if group is None:
        row = jobs.aggregate(jobs=Count("pk"))
        row.update({name: value or 0 for name, value in metrics.aggregate(**tokens).items()})
        return row
    counted = {r[group]: {**r, **dict.fromkeys(USAGE_TOKENS, 0)} for r in jobs.values(group).annotate(jobs=Count("pk"))}
    for r in metrics.values(f"job__{group}").annotate(**tokens):
        counted[r[f"job__{group}"]].update({name: r[name] or 0 for name in USAGE_TOKENS})
    return sorted(counted.values(), key=lambda r: (-r["output_tokens"], str(r[group])))
