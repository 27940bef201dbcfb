"""A ``/v1`` chat job run by the web process itself.

Every job is normally run by a worker: its message goes through the broker, a worker's thread
claims it, and its tokens come back through the job's stream in the broker, which the web
process reads. For a chat that the decode queue would start at once anyway (nobody waiting, a
worker thread's worth of room), those hops are all cost: some 36 ms before the first token on an
idle box here, which is most of a GPU's time to first token, and a broker write and read per
token. So the web process claims such a job as it creates it, runs it in a thread of its own on
this node's engine, and hands its events to the request from that thread.

It is the same attempt a worker would run (``lifecycle.job_run_claimed``): fenced, watched,
heartbeating, its stream written to the broker as always (the job page and
``/api/v1/jobs/{id}/stream`` read it there; in batches of a quarter of a second, since the
request has each token from the attempt's thread), put back to its queue for a worker if the engine is
lost, handed on by the watchdog if this process stops. The relay then follows the job's stream in
the broker from the last event this process saw.

Only when this node's engine is the only one the decode queue's workers use (a single box);
with several engines, placement decides where a job runs, and the workers run it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import connections

from appliance.broker import PUBLISH_ERRORS
from inference import lifecycle
from inference.engine.client import EngineClient
from inference.models import Queue

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Engine:
    """This node's engine, which this process may run ``/v1`` jobs on: its client and its key."""

    client: EngineClient
    key: str


def engine_here() -> Engine | None:
    """This node's engine, if ``/v1`` jobs may be run here (``APPLIANCE_V1_IN_WEB``): it is on
    this machine (its Unix socket is here) and the cluster view lists no other engine for the
    decode queue, nor this one down (restarting: the workers wait for it). None sends them to
    the workers."""
    if not settings.APPLIANCE_V1_IN_WEB:
        return None
    celery_queue = lifecycle.celery_queue_for(Queue.DECODE)
    if celery_queue != Queue.DECODE:  # ``fifo`` scheduling (a benchmark's baseline): one queue for all
        return None
    client = EngineClient.from_settings()
    if not client.socket_path or not os.path.exists(client.socket_path):  # a web node without an engine
        return None
    key = lifecycle.this_engine(client)
    try:
        engines = lifecycle.engines_serving(celery_queue)
    except PUBLISH_ERRORS:  # the broker is away: creating the job will say so
        return None
    if any(e.key != key or not e.up for e in engines):
        return None
    return Engine(client, key)


class _Runners:
    """Threads kept for running jobs, so that a job does not wait for a new thread to start:
    under load on a small machine a thread started per job began up to 330 ms later (the time
    it took the new thread to be scheduled and get the interpreter's lock), before the job's
    first token. Daemon threads: the process's shutdown does not wait for a stream. They are
    started as jobs need them, at most as many as jobs run at once (then a job waits for one)."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def run(self, work: Callable[[], None]) -> None:
        with self._lock:
            self._work.put(work)
            # A thread for each job waiting beyond those idle (none waits while another runs).
            if self._idle < self._work.qsize() and self._threads < max(1, settings.APPLIANCE_DECODE_CONCURRENCY):
                self._threads += 1
                threading.Thread(target=self._serve, name=f"v1-runner-{self._threads}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            work = self._work.get()
            with self._lock:
                self._idle -= 1
            work()  # HereRun._run: it catches what it raises


_runners = _Runners()


class HereRun:
    """A claimed job running in a thread of this process; its events (stream id, name, data)
    wait in ``events`` for the request's coroutine, and None once the attempt has ended."""

    def __init__(self, job_id, engine: Engine) -> None:
        self.job_id = job_id
        self.events: asyncio.Queue[tuple[str, str, dict] | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._client = engine.client
        _runners.run(self._run)

    def _put(self, item: tuple[str, str, dict] | None) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the request's loop is gone; the attempt goes on writing its stream
            pass

    def _listen(self, entry_id: str, event: str, data: dict) -> None:
        self._put((entry_id, event, data))

    def _run(self) -> None:
        try:
            lifecycle.job_run_claimed(job_id=self.job_id, client=self._client, listener=self._listen)
        except Exception:  # the row stays running: the watchdog hands it on once its heartbeat stops
            logger.exception("job %s: running it in the web process failed", self.job_id)
        finally:
            connections.close_all()  # back to the pool: a kept thread holds none between jobs
            self._put(None)
