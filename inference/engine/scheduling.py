"""How the engine host shares one engine between documents and drafting. Pure asyncio, no vLLM.

Three policies, chosen by ``APPLIANCE_SCHEDULING`` (and switchable on a running host, which is
how ``bench scheduling`` compares them in one run):

- ``appliance`` (the default): KV-budget admission; drafting before documents in the engine
  (vLLM's ``priority`` policy); and documents prefill through the *prefill lane*: in slices of
  ``slice_tokens``, one slice in the engine at a time (shortest remaining prefill first), and none while a drafting request waits or
  streams. A step of the engine is atomic and a prefill step costs time in proportion to its
  tokens, so a drafter never waits behind more than one slice, and its tokens are not slowed by
  document prefill at all. Slices cost almost nothing (each is a request for the next block-
  aligned prefix with one output token; the prefix cache keeps what the previous slice
  computed), so documents run at full speed whenever nobody is drafting: the lane is
  work-conserving. A document never waits more than ``max_pause_s`` for drafting traffic before
  it gets a slice, so that a day of continuous drafting cannot starve it.
- ``engine``: vLLM's own priority scheduling, nothing else (no admission control, no lane).
- ``fifo``: every request at the same priority, in arrival order, nothing else.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from enum import StrEnum


class Scheduling(StrEnum):
    APPLIANCE = "appliance"
    ENGINE = "engine"
    FIFO = "fifo"

    @property
    def admission_control(self) -> bool:
        return self is Scheduling.APPLIANCE

    @property
    def prefill_lane(self) -> bool:
        return self is Scheduling.APPLIANCE

    @property
    def priorities(self) -> bool:
        return self is not Scheduling.FIFO


def round_to_block(tokens: int, block_size: int) -> int:
    """``tokens`` rounded up to a whole number of KV blocks (at least one)."""
    return max(block_size, -(-tokens // block_size) * block_size)


class PrefillLane:
    """One document prefill slice in the engine at a time, and none while drafting is active.

    The turn goes to the waiting document with the fewest prompt tokens left to prefill (ties in
    arrival order): shortest remaining work first, so a one-page letter does not wait behind a
    long contract, and documents finish one after another rather than all at the end (a finished
    prefill decodes while the next document's slices run, nearly for free). The inference
    workers' concurrency cap bounds how many documents can be waiting, so none starves.
    ``drafting_started`` / ``drafting_finished`` bracket every drafting request from its arrival
    at the host to its end.
    """

    def __init__(self, *, max_pause_s: float = 5.0, clock=time.monotonic) -> None:
        self.max_pause_s = max_pause_s
        self._clock = clock
        self._busy = False
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._seq = itertools.count()
        self._quiet = asyncio.Event()
        self._quiet.set()
        self.drafting = 0
        self.slices = 0
        self._holding_for_quiet = 0
        self._last_slice_end = clock()
        self._drafting_since = clock()

    @property
    def waiting(self) -> int:
        """Documents waiting: for the lane, or holding it until drafting is over."""
        return sum(1 for *_, future in self._waiters if not future.done()) + self._holding_for_quiet

    # --- drafting activity ------------------------------------------------------------------

    def drafting_started(self) -> None:
        if self.drafting == 0:
            self._drafting_since = self._clock()
            self._quiet.clear()
        self.drafting += 1

    def drafting_finished(self) -> None:
        self.drafting = max(0, self.drafting - 1)
        if self.drafting == 0:
            self._quiet.set()

    # --- documents --------------------------------------------------------------------------

    async def acquire(self, remaining_tokens: int = 0) -> None:
        """Wait for this document's turn: the lane free and its turn by remaining work, and no
        drafting (or documents have waited ``max_pause_s``)."""
        if self._busy or self._waiters:
            future = asyncio.get_running_loop().create_future()
            entry = (remaining_tokens, next(self._seq), future)
            heapq.heappush(self._waiters, entry)
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._hand_on()  # granted just as it was cancelled: pass the turn on
                else:
                    self._waiters.remove(entry)
                    heapq.heapify(self._waiters)
                raise
        else:
            self._busy = True
        try:
            await self._wait_for_quiet()
        except BaseException:
            self._hand_on()
            raise

    def release(self) -> None:
        """End a slice. The turn is handed on at the loop's next iteration, so that a document
        that asks again at once (its next slice) competes for it with what it has left."""
        self.slices += 1
        self._last_slice_end = self._clock()
        asyncio.get_running_loop().call_soon(self._hand_on)

    def _hand_on(self) -> None:
        while self._waiters:
            *_, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)  # the lane stays busy: it is this waiter's now
                return
        self._busy = False

    async def _wait_for_quiet(self) -> None:
        self._holding_for_quiet += 1
        try:
            await self._wait_for_quiet_inner()
        finally:
            self._holding_for_quiet -= 1

    async def _wait_for_quiet_inner(self) -> None:
        while not self._quiet.is_set():
            paused_since = max(self._last_slice_end, self._drafting_since)
            remaining = self.max_pause_s - (self._clock() - paused_since)
            if remaining <= 0:
                return  # documents have waited long enough: one slice, then they wait again
            try:
                await asyncio.wait_for(self._quiet.wait(), timeout=remaining)
            except TimeoutError:
                return

    def snapshot(self) -> dict[str, int]:
        return {
            "drafting_requests": self.drafting,
            "prefill_lane_waiting": self.waiting,
            "prefill_lane_busy": int(self._busy),
            "prefill_slices": self.slices,
        }
