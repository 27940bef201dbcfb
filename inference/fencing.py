"""The writes a running attempt makes while it works, each conditional on its claim, and the
thread that keeps its claim alive.

An attempt holds its job while the row says ``RUNNING`` under the attempt's number
(``attempts.Attempt``); the watchdog hands a job on by moving it back to ``QUEUED``, and the next
claim raises the number. Every write here says ``state=RUNNING, attempts=<number>`` in its
``WHERE``, every stream event goes through the broker's fence (``streaming.publish_fenced``),
and a write that finds the claim gone tells the attempt to stop. ``attempt_watch`` runs for the
whole of a job (reading the document, searching, counting tokens, checking, storing), not only
while the engine streams: it marks the job alive every quarter of the heartbeat timeout, and
stops the attempt (closing its engine request) when the claim is lost or the deadline passes.
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager

from django.conf import settings
from django.db import connection
from django.db.models.expressions import RawSQL
from django.utils import timezone

from inference import streaming
from inference.attempts import RECORDED, Attempt, StopReason
from inference.models import Job

logger = logging.getLogger(__name__)


def held(attempt: Attempt):
    """The job's row, while (and only while) this attempt holds it."""
    return Job.objects.filter(pk=attempt.job_id, state=Job.State.RUNNING, attempts=attempt.number)


def heartbeat(attempt: Attempt) -> bool:
    """Mark the job alive; False once the attempt no longer holds it."""
    return bool(held(attempt).update(heartbeat_at=timezone.now()))


def publish(attempt: Attempt, event: str, data: dict, *, delivered: bool = False) -> None:
    """Append an event to the job's stream if the attempt still holds it (and hand it to the
    attempt's ``listener``, if it has one: only its stream id, as ``RECORDED``, if the listener
    has had it already: ``delivered``), then stop the attempt (raising ``AttemptStopped``) if it
    was refused, the job was cancelled, or time is up."""
    outcome, entry_id = streaming.publish_fenced_entry(attempt.job_id, event, data, attempt=attempt.number)
    if entry_id and attempt.listener is not None:  # appended: its reader in this process has it at once
        attempt.listener(entry_id, *((RECORDED, {}) if delivered else (event, data)))
    if outcome is streaming.Outcome.FENCED:
        attempt.stop(StopReason.CLAIM_LOST)
    elif outcome is streaming.Outcome.CANCELLED:
        attempt.stop(StopReason.CANCELLED)
    attempt.check()


def deliver(attempt: Attempt, event: str, data: dict) -> None:
    """Hand an event to the attempt's listener before the stream has it (stream id ""); a later
    ``publish(..., delivered=True)`` of the batch it is in records it. Checks no claim: what the
    listener is handed is its own request's, and an attempt that has lost its claim is stopped at
    the next publish, before any of it is recorded."""
    if attempt.listener is not None:
        attempt.listener("", event, data)


def checkpoint_add(attempt: Attempt, key: str, entry: dict) -> None:
    """Keep one finished part of the job (merged into ``Job.checkpoint`` in the database, not
    rewritten from this process's copy), or stop the attempt if it no longer holds the job."""
    if not held(attempt).update(checkpoint=RawSQL("checkpoint || %s::jsonb", (json.dumps({key: entry}),))):
        attempt.stop(StopReason.CLAIM_LOST)
    attempt.check()


@contextmanager
def attempt_watch(attempt: Attempt):
    """While the body runs, one thread keeps the attempt's claim alive and stops the attempt when
    the claim is lost (the row moved on: handed on, cancelled, failed) or the deadline passes.
    A long prefill sends no tokens, and sectioning or a support check talks to nobody, but the
    worker is alive all the same."""
    done = threading.Event()
    interval_s = settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S / 4

    def watch() -> None:
        try:
            while not done.wait(min(interval_s, max(0.05, attempt.remaining_s()))):
                reason = attempt.reason
                if reason is not None:  # the deadline passed, or another thread stopped it
                    attempt.stop(reason)  # closes the engine request it has open
                    return
                try:
                    alive = heartbeat(attempt)
                except Exception:  # the next beat tries again; the watchdog is patient
                    logger.warning("job %s: heartbeat failed", attempt.job_id, exc_info=True)
                    continue
                finally:
                    connection.close()  # back to the pool between beats: a job holds one, not two
                if not alive:
                    reason = _why_not_held(attempt)
                    logger.warning("job %s: attempt %s no longer holds it (%s); stopping it", attempt.job_id,
                                   attempt.number, reason.value)  # fmt: skip
                    attempt.stop(reason)
                    return
        finally:
            connection.close()

    thread = threading.Thread(target=watch, name=f"attempt-{attempt.job_id}-{attempt.number}", daemon=True)
    thread.start()
    try:
        yield attempt
    finally:
        done.set()
        thread.join(timeout=5)


def _why_not_held(attempt: Attempt) -> StopReason:
    state = Job.objects.filter(pk=attempt.job_id).values_list("state", flat=True).first()
    return StopReason.CANCELLED if state == Job.State.CANCELLED else StopReason.CLAIM_LOST
