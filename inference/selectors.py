"""Reads for jobs, filtered by owner in the query itself."""

from __future__ import annotations

from datetime import timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Avg, DurationField, ExpressionWrapper, F
from django.utils import timezone

from inference.models import Job, Queue

ETA_WINDOW = timedelta(hours=1)


def job_for_user(*, user: AbstractBaseUser, job_id) -> Job | None:
    if not user.is_authenticated:
        return None
    return Job.objects.select_related("document", "metrics").filter(owner=user, pk=job_id).first()


def jobs_of(*, user: AbstractBaseUser):
    """The user's jobs, newest first."""
    if not user.is_authenticated:
        return Job.objects.none()
    return Job.objects.select_related("document", "metrics").filter(owner=user).order_by("-created_at")


async def ajob_for_user(*, user: AbstractBaseUser, job_id) -> Job | None:
    if not user.is_authenticated:
        return None
    return await Job.objects.select_related("document").filter(owner=user, pk=job_id).afirst()


def queue_concurrency(queue: Queue | str) -> int:
    return {
        Queue.PREFILL: settings.APPLIANCE_PREFILL_CONCURRENCY,
        Queue.DECODE: settings.APPLIANCE_DECODE_CONCURRENCY,
    }[Queue(queue)]


def queue_position(job: Job) -> int:
    """1-based place of a queued job in its queue (arrival order); 0 once it has started."""
    if job.state != Job.State.QUEUED:
        return 0
    return Job.objects.filter(queue=job.queue, state=Job.State.QUEUED, created_at__lt=job.created_at).count() + 1


def queue_eta_s(*, queue: Queue | str, position: int) -> float | None:
    """Seconds until a job at ``position`` finishes, from how long this queue's jobs took in the
    last hour and how many run at once; None before any job of the queue has finished."""
    since = timezone.now() - ETA_WINDOW
    duration = (
        Job.objects.filter(queue=queue, state=Job.State.SUCCEEDED, finished_at__gte=since, started_at__isnull=False)
        .annotate(took=ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField()))
        .aggregate(mean=Avg("took"))["mean"]
    )
    if duration is None:
        return None
    rounds = -(-max(position, 1) // queue_concurrency(queue))  # ceil: jobs run in rounds of the cap
    return round(rounds * duration.total_seconds(), 1)


def job_queue_status(job: Job) -> dict:
    position = queue_position(job)
    return {"position": position, "eta_s": queue_eta_s(queue=job.queue, position=position) if position else None}


@sync_to_async
def ajob_queue_status(*, job_id) -> dict | None:
    job = Job.objects.filter(pk=job_id).only("pk", "queue", "state", "created_at").first()
    if job is None:
        return None
    return {"state": job.state, **job_queue_status(job)}
