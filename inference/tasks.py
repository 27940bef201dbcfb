"""Celery tasks of the ``prefill`` and ``decode`` queues: thin clients of the engine host.

A task takes a job id, re-fetches it, and calls one service. The queue and the time limit are
chosen when the job is enqueued (``Job.queue``, ``APPLIANCE_JOB_TIME_LIMIT_S``), so the same task
serves both pools.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from inference import services
from inference.engine.client import EngineUnavailable

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 4


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=MAX_ATTEMPTS - 1)
def run_job(self, job_id: str) -> None:
    try:
        services.job_run(job_id=job_id)
    except EngineUnavailable as exc:
        if self.request.retries >= self.max_retries:
            services.job_fail(job_id=job_id, reason=f"The engine is not available: {exc}. Try again later.")
            return
        logger.warning("job %s: engine unavailable (%s); retrying", job_id, exc)
        raise self.retry(exc=exc, countdown=min(60, 5 * 2**self.request.retries)) from exc
    except SoftTimeLimitExceeded:
        services.job_fail(job_id=job_id, reason="The job ran past the appliance's time limit and was stopped.")
    except Exception:
        logger.exception("job %s failed", job_id)
        services.job_fail(job_id=job_id, reason="An internal error stopped this job; the administrator can find it in the logs.")
