"""How the engine host shares one engine between documents and drafting. Pure asyncio, no vLLM.

Three policies, chosen by ``APPLIANCE_SCHEDULING`` (and switchable on a running host, which is
how ``bench scheduling`` compares them in one run):

- ``appliance`` (the default): KV-budget admission; drafting before documents in the engine
  (vLLM's ``priority`` policy); and documents prefill through the *prefill lane*: in slices of
  ``slice_tokens``, one slice in the engine at a time, and none while a drafting request waits or
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


def slice_ends(prompt_tokens: int, slice_tokens: int, start: int = 0) -> list[int]:
    """Where the slices of a prompt end, before the final request that reads the whole prompt.

    Every end is a multiple of ``slice_tokens`` (itself a multiple of the KV block size, so the
    prefix cache keeps each slice whole) and strictly inside the prompt."""
    if slice_tokens <= 0:
        raise ValueError("slice_tokens must be positive")
    first = (start // slice_tokens + 1) * slice_tokens
    return list(range(first, prompt_tokens, slice_tokens))


def round_to_block(tokens: int, block_size: int) -> int:
    """``tokens`` rounded up to a whole number of KV blocks (at least one)."""
    return max(block_size, -(-tokens // block_size) * block_size)


class PrefillLane:
    """One document prefill slice in the engine at a time, and none while drafting is active.

    Documents take turns slice by slice (``asyncio.Lock`` wakes waiters in arrival order), so a
    short document is not stuck behind a long one. ``drafting_started`` / ``drafting_finished``
    bracket every drafting request from its arrival at the host to its end.
    """

    def __init__(self, *, max_pause_s: float = 5.0, clock=time.monotonic) -> None:
        self.max_pause_s = max_pause_s
        self._clock = clock
        self._turn = asyncio.Lock()
        self._quiet = asyncio.Event()
        self._quiet.set()
        self.drafting = 0
        self.waiting = 0
        self.slices = 0
        self._last_slice_end = clock()
        self._drafting_since = clock()

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

    async def acquire(self) -> None:
        """Wait for this document's turn: the lane free, and no drafting (or waited long enough)."""
        self.waiting += 1
        try:
            await self._turn.acquire()
            try:
                await self._wait_for_quiet()
            except BaseException:
                self._turn.release()
                raise
        finally:
            self.waiting -= 1

    def release(self) -> None:
        self.slices += 1
        self._last_slice_end = self._clock()
        self._turn.release()

    async def _wait_for_quiet(self) -> None:
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
            "prefill_lane_busy": int(self._turn.locked()),
            "prefill_slices": self.slices,
        }
