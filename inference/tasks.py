"""Celery tasks of the ``prefill`` and ``decode`` queues: thin clients of the engine host.

A ``run_job`` message is a *turn* of its queue: the worker that takes it runs the next job of
that queue by fair share (``lifecycle.job_run_next``), which is usually, but not always, the job
the message was sent for. The queue is chosen when the job is sent (``Job.celery_queue``), so
the same task serves both pools. Each inference worker also runs the watchdog that hands on the
jobs of a worker that stopped reporting and sends the jobs whose message was never published or
went with a broker that lost its queues (``lifecycle.jobs_recover_stale``,
``lifecycle.jobs_unsent_if_the_broker_forgot``, ``lifecycle.jobs_dispatch_pending``).
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from django.conf import settings

from appliance.celery import Watchdog, worker_pool
from inference import lifecycle, placement, services

logger = logging.getLogger(__name__)


def is_inference_worker(nodename: str) -> bool:
    """``prefill@host``, ``decode@host``, and those of a node's further engines (``prefill-1@host``)
    or of a benchmark (``decode-bench@host``)."""
    return worker_pool(nodename) in ("prefill", "decode")


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def run_job(self, job_id: str, celery_queue: str | None = None, hops: int = 0) -> None:
    """A turn of ``celery_queue``, sent for ``job_id`` (older messages name no queue: the one
    they came from), passed on ``hops`` times by placement (``inference.placement``). Every failure of the job itself is handled inside the service; this only
    keeps the turn when the service could not even start (the database away, say), so that no
    queued job is left without one."""
    queue = celery_queue or (self.request.delivery_info or {}).get("routing_key") or "prefill"
    try:
        lifecycle.job_run_next(celery_queue=queue, job_id=job_id, hops=hops)
    except Exception as exc:
        logger.exception("a turn of the %s queue failed; it comes back", queue)
        raise self.retry(exc=exc, countdown=min(60, 2 ** (self.request.retries + 1))) from exc


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def check_drafts(owner_id: int) -> None:
    """Check a person's edited drafts against their passages, one after another (the decode
    worker has the embedder)."""
    services.draft_checks_run(owner_id=owner_id)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def check_draft(job_id: str, version: int) -> None:
    """Check one edited draft: what the version before ``check_drafts`` queued, still taken after
    an upgrade from the broker."""
    services.draft_check_or_say_why_not(job_id=job_id, version=version)


def _sweep() -> None:
    requeued, failed = lifecycle.jobs_recover_stale()
    lifecycle.jobs_unsent_if_the_broker_forgot()
    sent = lifecycle.jobs_dispatch_pending()
    if requeued or failed or sent:
        logger.warning("watchdog: %d job(s) handed on, %d given up, %d sent that never were", requeued, failed, sent)


_watchdog = Watchdog("job-watchdog", _sweep)


@celeryd_after_setup.connect
def consume_this_engines_turns(sender=None, instance=None, **kwargs) -> None:
    """An inference worker also takes the turns placement passes to its engine alone."""
    if instance is None or not is_inference_worker(str(sender or "")):
        return
    from inference.engine.client import EngineClient

    engine = lifecycle.this_engine(EngineClient.from_settings())
    queues = instance.app.amqp.queues
    for name in [q for q in ("prefill", "decode") if q in queues.consume_from]:
        queues.select_add(placement.direct_queue(name, engine))


@worker_ready.connect
def start_watchdog(sender=None, **kwargs) -> None:
    if is_inference_worker(str(getattr(sender, "hostname", ""))):
        _watchdog.start(max(1.0, settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S / 4))
        from documents.embeddings import get_embedder, load_ahead

        load_ahead(get_embedder)


@worker_shutdown.connect
def stop_watchdog(**kwargs) -> None:
    _watchdog.stop()
