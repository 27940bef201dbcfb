"""Celery tasks of the ``prefill`` and ``decode`` queues: thin clients of the engine host.

A task takes a job id, re-fetches it, and calls one service. The queue and the time limit are
chosen when the job is enqueued (``Job.queue``, ``APPLIANCE_JOB_TIME_LIMIT_S``), so the same task
serves both pools. Each inference worker also runs the watchdog that hands on the jobs of a
worker that died (``services.jobs_recover_stale``).
"""

from __future__ import annotations

import logging
import threading

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections

from inference import services
from inference.engine.client import EngineUnavailable

logger = logging.getLogger(__name__)

INFERENCE_WORKER_PREFIXES = ("prefill@", "decode@")


def engine_retry_delays_s(window_s: float) -> list[int]:
    """Pauses between retries while the engine host is down: 2, 4, 8, 16, then every 30 s, until
    they add up to ``window_s`` (an engine host restarts in about two minutes)."""
    delays: list[int] = []
    while sum(delays) < window_s:
        delays.append(min(30, 2 ** (len(delays) + 1)))
    return delays


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def run_job(self, job_id: str) -> None:
    try:
        services.job_run(job_id=job_id)
    except EngineUnavailable as exc:
        services.job_requeue(job_id=job_id)
        delays = engine_retry_delays_s(settings.APPLIANCE_ENGINE_RETRY_WINDOW_S)
        if self.request.retries >= len(delays):
            services.job_fail(job_id=job_id, reason=f"The engine is not available: {exc}. Try again later.")
            return
        logger.warning("job %s: engine unavailable (%s); retrying", job_id, exc)
        raise self.retry(exc=exc, countdown=delays[self.request.retries]) from exc
    except SoftTimeLimitExceeded:
        services.job_fail(job_id=job_id, reason="The job ran past the appliance's time limit and was stopped.")
    except Exception:
        logger.exception("job %s failed", job_id)
        services.job_fail(
            job_id=job_id, reason="An internal error stopped this job; the administrator can find it in the logs."
        )


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def check_draft(job_id: str, version: int) -> None:
    """Check an edited draft against its passages (the decode worker has the embedder)."""
    try:
        services.draft_check_edit(job_id=job_id, version=version)
    except Exception:
        logger.exception("job %s: the edited draft could not be checked", job_id)
        services.draft_check_failed(job_id=job_id, version=version)


_watchdog_stop = threading.Event()


def _watchdog() -> None:
    interval_s = max(1.0, settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S / 4)
    while True:
        try:
            close_old_connections()
            requeued, failed = services.jobs_recover_stale()
            if requeued or failed:
                logger.warning("watchdog: %d job(s) sent again, %d given up", requeued, failed)
        except Exception:
            logger.exception("watchdog: could not check for stale jobs")
        finally:
            close_old_connections()
        if _watchdog_stop.wait(interval_s):
            return


@worker_ready.connect
def start_watchdog(sender=None, **kwargs) -> None:
    if not str(getattr(sender, "hostname", "")).startswith(INFERENCE_WORKER_PREFIXES):
        return
    _watchdog_stop.clear()
    threading.Thread(target=_watchdog, name="job-watchdog", daemon=True).start()


@worker_shutdown.connect
def stop_watchdog(**kwargs) -> None:
    _watchdog_stop.set()
