"""Celery tasks of the ``ingest`` queue: thin, they take ids and call one service. Sources are
polled here too (Celery beat queues ``poll_due_sources`` every minute), and the ingest worker
runs a watchdog that sends the ingestion of an upload whose message was never sent, or went with
a broker that lost its queues (``services.documents_dispatch_pending``,
``services.documents_unsent_if_the_broker_forgot``).

A cancelled document's task is not revoked: when a worker takes it, the service finds the
document finished (cancelled) and returns at once; a document cancelled while it runs stops at
the service's next check (``documents.services``), so a cancel never kills a worker."""

from __future__ import annotations

import logging
import os

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from django.conf import settings
from django.db.backends.signals import connection_created

from appliance.celery import Watchdog, worker_pool
from appliance.database import share_niceness
from documents import services, source_services

logger = logging.getLogger(__name__)


@celeryd_after_setup.connect
def ingest_yields_the_cpu(sender=None, instance=None, **kwargs) -> None:
    """Reading documents is background work: the ingest worker (and the extraction children it
    starts, which inherit it) runs ``APPLIANCE_INGEST_NICE`` steps below the other processes, so
    that where the CPU is contended the drafting workers, the web server and a CPU engine are
    served first. With the CPU to itself it runs at full speed (a priority, not a cap). The
    Postgres backends it queries on this machine (its passages' writes and their index updates)
    run at its niceness too: at full priority they competed with the drafters' job claims.
    ``APPLIANCE_INGEST_CPU_CLASS`` may also put its embedding in Linux's idle CPU class, while
    this machine's engine drafts (``idle-while-drafting``) or always (``idle-embedding``), or the
    whole worker (``idle``)."""
    if instance is None or "ingest" not in instance.app.amqp.queues.consume_from:
        return
    increment = settings.APPLIANCE_INGEST_NICE
    if increment:
        niceness = os.nice(increment)
        connection_created.connect(_backend_yields_too, weak=False, dispatch_uid="ingest-backend-niceness")
        logger.info("ingest worker: CPU priority lowered by %s (niceness %s), its database backends' too",
                    increment, niceness)  # fmt: skip
    embedding_idle = {"idle-embedding": "idle", "idle-while-drafting": "while-drafting"}
    if settings.APPLIANCE_INGEST_CPU_CLASS in embedding_idle:
        from documents import embeddings

        embeddings.embed_in_idle_class(embedding_idle[settings.APPLIANCE_INGEST_CPU_CLASS])
        logger.info("ingest worker: its embedding in the idle CPU class (SCHED_IDLE): %s",
                    settings.APPLIANCE_INGEST_CPU_CLASS)  # fmt: skip
    elif settings.APPLIANCE_INGEST_CPU_CLASS == "idle":
        idle_threads = idle_cpu_class()
        logger.info("ingest worker: in the idle CPU class (SCHED_IDLE, %d thread(s) so far)", idle_threads)


def idle_cpu_class() -> int:
    """Put every thread of this process in Linux's idle scheduling class (``SCHED_IDLE``): it
    gets almost no CPU while a process of the normal class wants it, and a waking one takes the
    CPU from it at once. Threads and children started later inherit the class. The number of
    threads moved. (``APPLIANCE_INGEST_CPU_CLASS=idle``; not the default: see its setting.)"""
    moved = 0
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(task), os.SCHED_IDLE, os.sched_param(0))
            moved += 1
        except (ProcessLookupError, PermissionError):  # ended meanwhile / not ours
            continue
    return moved


def _backend_yields_too(sender, connection, **kwargs) -> None:
    """Each connection this worker takes (a pool's checkout included) is served at its niceness."""
    share_niceness(connection, os.getpriority(os.PRIO_PROCESS, 0))


def _sweep() -> None:
    services.documents_unsent_if_the_broker_forgot()
    services.documents_dispatch_pending()


_watchdog = Watchdog("document-watchdog", _sweep)


@worker_ready.connect
def start_watchdog(sender=None, **kwargs) -> None:
    """The ingest worker sends, every half grace period, the ingestion of uploads whose message
    was never sent, and loads its passages' embedder ahead of the first upload."""
    if worker_pool(str(getattr(sender, "hostname", ""))) == "ingest":
        _watchdog.start(services.DISPATCH_GRACE_S / 2)
        from documents.embeddings import load_ahead, passage_embedder

        load_ahead(passage_embedder)


@worker_shutdown.connect
def stop_watchdog(**kwargs) -> None:
    _watchdog.stop()


# Extraction has its own time limit inside the sandbox; these are the outer bounds, which Celery
# keeps on a prefork pool; on the ingest worker's threads pool the service keeps the same limit.
# (settings.CELERY_BROKER_TRANSPORT_OPTIONS keeps the visibility timeout above these.)
INGEST_TIME_LIMIT_S = services.INGEST_TIME_LIMIT_S
_LIMITS = {"soft_time_limit": INGEST_TIME_LIMIT_S, "time_limit": INGEST_TIME_LIMIT_S + 60}


def _logged(document_id: int, step) -> None:
    """The service ends each reading it holds itself (ready, failed with a reason, timed out,
    cancelled, or left to the reader that took it over); what breaks outside one (the database
    away as the document is taken) is logged, and the document left to its reader, if any, or to
    the watchdog."""
    try:
        step(document_id=document_id)
    except Exception:
        logger.exception("document %s: processing failed", document_id)


@shared_task(acks_late=True, reject_on_worker_lost=True, **_LIMITS)
def ingest_document(document_id: int) -> None:
    _logged(document_id, services.document_ingest)


@shared_task(acks_late=True, reject_on_worker_lost=True, **_LIMITS)
def embed_document(document_id: int) -> None:
    _logged(document_id, services.document_embed)


# A poll stops taking new files at source_services.POLL_BUDGET_S (10 minutes); these bound it.
SOURCE_POLL_TIME_LIMIT_S = 900


@shared_task(name="documents.tasks.poll_due_sources", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def poll_due_sources() -> None:
    """Celery beat's tick (``APPLIANCE_SOURCE_TICK_S``): a poll queued for each source due one."""
    for source_id in source_services.sources_due():
        poll_source.delay(source_id, only_if_due=True)


@shared_task(
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    soft_time_limit=SOURCE_POLL_TIME_LIMIT_S,
    time_limit=SOURCE_POLL_TIME_LIMIT_S + 60,
)
def poll_source(source_id: int, only_if_due: bool = False) -> None:
    source_services.source_poll(source_id=source_id, only_if_due=only_if_due)
