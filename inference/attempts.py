"""One attempt at a job in a worker: its fencing token, its deadline, and why it must stop.

A job may be started more than once (its worker stopped reporting and the watchdog handed it on,
or the engine died under it). ``Job.attempts`` after a claim is the attempt's *fencing token*:
every write the attempt makes (heartbeat, checkpoint, result, stream event, failure) is
conditional on the job still running under that number, so an attempt that lost its claim
writes nothing more, even if it was only slow. An attempt also carries the job's deadline
(``APPLIANCE_JOB_TIME_LIMIT_S``: Celery's time limits do nothing in the ``threads`` pools the
inference workers use) and the engine request it has open, so that whichever thread notices a
reason to stop (a cancel, a lost claim, the deadline) closes that request at once.

No ORM and no broker here: the writes are in ``services``; this is the state they share with the
job's watch thread (``running.attempt_watch``). The clock is an argument, for tests.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable


class StopReason(enum.Enum):
    CANCELLED = "cancelled"  # the user (or an admin) cancelled it: the row says so already
    CLAIM_LOST = "claim_lost"  # the job was handed on, finished or failed elsewhere: write nothing
    DEADLINE = "deadline"  # it ran past the time limit: it fails with a reason


class AttemptStopped(Exception):
    """Raised inside the attempt where it checks; ``reason`` says what the caller does next."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


def time_limit_reason(limit_s: int) -> str:
    """What a person reads when their job ran out of time."""
    limit = f"{limit_s // 60} minutes" if limit_s % 60 == 0 and limit_s >= 120 else f"{limit_s} seconds"
    return (
        f"The job took longer than the {limit} the appliance allows one job, so it was stopped. "
        "A shorter document, or fewer clause categories, takes less time; the administrator can "
        "raise the limit (APPLIANCE_JOB_TIME_LIMIT_S)."
    )


class OpenRequests:
    """Engine requests open at the same time, each with the function that closes it from any
    thread. Once ``close_all`` has run, a request opened later is closed at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborts: list[Callable[[], None]] = []
        self.closing = False

    def opened(self, abort: Callable[[], None]) -> None:
        with self._lock:
            self._aborts.append(abort)
            closing = self.closing
        if closing:
            abort()

    def closed(self, abort: Callable[[], None]) -> None:
        with self._lock:
            if abort in self._aborts:
                self._aborts.remove(abort)

    def close_all(self) -> None:
        with self._lock:
            self.closing = True
            aborts = list(self._aborts)
        for abort in aborts:
            abort()


# Called with each event the attempt appends to its job's stream (its stream id, its name, its
# data), in the attempt's thread: a reader in the same process (``/v1`` run in the web process)
# has it without reading the stream back from the broker. Tokens reach it before the stream has
# them (stream id ""), as they arrive; the stream gets them in batches, and each batch is then
# told to the listener as a ``RECORDED`` event with the batch's stream id and no data: the point
# in the stream up to which the listener has everything.
Listener = Callable[[str, str, dict], None]
RECORDED = "recorded"


class Attempt:
    """The running attempt ``number`` at job ``job_id``, which must end by ``deadline`` (on the
    ``clock``'s scale, ``time.monotonic`` by default); ``listener``, if any, is handed every
    event it appends to the job's stream."""

    def __init__(
        self,
        job_id,
        number: int,
        *,
        deadline: float,
        clock: Callable[[], float] = time.monotonic,
        listener: Listener | None = None,
    ) -> None:
        self.job_id = job_id
        self.number = number
        self.deadline = deadline
        self.clock = clock
        self.listener = listener
        self._lock = threading.Lock()
        self._reason: StopReason | None = None
        self._open = OpenRequests()

    @classmethod
    def starting_now(
        cls,
        job_id,
        number: int,
        *,
        limit_s: float,
        clock: Callable[[], float] = time.monotonic,
        listener: Listener | None = None,
    ):
        return cls(job_id, number, deadline=clock() + limit_s, clock=clock, listener=listener)

    @property
    def reason(self) -> StopReason | None:
        """Why it must stop, or None while it may go on (the deadline counts once it has passed)."""
        with self._lock:
            if self._reason is None and self.clock() >= self.deadline:
                self._reason = StopReason.DEADLINE
            reason = self._reason
        if reason is not None:
            self._open.closing = True  # a request opened from now on is closed at once
        return reason

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - self.clock())

    def stop(self, reason: StopReason) -> None:
        """Record why it must stop (the first reason wins) and close what it has open."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._open.close_all()

    def check(self) -> None:
        """Raise ``AttemptStopped`` if the attempt must stop; called between every step."""
        reason = self.reason
        if reason is not None:
            self.stop(reason)  # closes an engine request still open (the deadline just passed)
            raise AttemptStopped(reason)

    def opened(self, abort: Callable[[], None]) -> None:
        """An engine request is open; ``abort`` closes it from any thread. If the attempt has
        already been told to stop, it is closed at once."""
        self._open.opened(abort)

    def closed(self, abort: Callable[[], None]) -> None:
        self._open.closed(abort)
