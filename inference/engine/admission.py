"""KV-cache admission: a request enters the engine only while its reservation fits.

A request reserves ``prompt tokens + max output tokens`` against the KV capacity vLLM reports at
start-up, times a safety factor. Document (prefill) requests may not use the last
``decode_reserve`` tokens of the budget, so that a drafter can always start. Requests that do not
fit wait in priority order (lower number first, then arrival); one that could never fit is
refused at once. Pure asyncio, no vLLM: the engine host owns one of these.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field


class AdmissionRefused(Exception):
    """The request can never fit in the KV budget, whatever else finishes."""


@dataclass(frozen=True)
class Reservation:
    request_id: str
    tokens: int
    priority: int


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    tokens: int = field(compare=False)
    request_id: str = field(compare=False)
    future: asyncio.Future = field(compare=False)


class KvAdmission:
    def __init__(
        self,
        capacity_tokens: int,
        *,
        safety_factor: float = 0.9,
        decode_reserve_fraction: float = 0.1,
        decode_priority: int = 0,
    ) -> None:
        if capacity_tokens <= 0:
            raise ValueError("KV capacity must be positive")
        self.capacity_tokens = capacity_tokens
        self.budget_tokens = int(capacity_tokens * safety_factor)
        self.decode_reserve_tokens = int(self.budget_tokens * decode_reserve_fraction)
        self.decode_priority = decode_priority
        self.reserved_tokens = 0
        self._active: dict[str, Reservation] = {}
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()

    def limit_for(self, priority: int) -> int:
        """How much of the budget requests of this priority may fill."""
        if priority <= self.decode_priority:
            return self.budget_tokens
        return self.budget_tokens - self.decode_reserve_tokens

    def _fits(self, tokens: int, priority: int) -> bool:
        return self.reserved_tokens + tokens <= self.limit_for(priority)

    async def acquire(self, request_id: str, tokens: int, priority: int) -> Reservation:
        if tokens > self.limit_for(priority):
            raise AdmissionRefused(
                f"needs {tokens} KV tokens but at most {self.limit_for(priority)} can ever be reserved"
            )
        # Start at once when it fits and nobody of the same or a more urgent priority waits: a
        # drafter that fits does not queue behind a document that does not.
        if self._fits(tokens, priority) and not any(
            w.priority <= priority and not w.future.done() for w in self._waiting
        ):
            return self._grant(request_id, tokens, priority)
        waiter = _Waiter(priority, next(self._seq), tokens, request_id, asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiting, waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result())  # granted just as it was cancelled
            else:
                if waiter in self._waiting:  # _wake may have dropped it already
                    self._waiting.remove(waiter)
                    heapq.heapify(self._waiting)
                self._wake()
            raise

    def release(self, reservation: Reservation) -> None:
        if self._active.pop(reservation.request_id, None) is None:
            return  # released twice (abort racing completion): harmless
        self.reserved_tokens -= reservation.tokens
        self._wake()

    def _grant(self, request_id: str, tokens: int, priority: int) -> Reservation:
        reservation = Reservation(request_id, tokens, priority)
        self._active[request_id] = reservation
        self.reserved_tokens += tokens
        return reservation

    def _wake(self) -> None:
        # Admit in order; stop at the first waiter that does not fit, so that a large request
        # is not starved by a stream of small ones behind it.
        while self._waiting:
            head = self._waiting[0]
            if head.future.done():
                heapq.heappop(self._waiting)
                continue
            if not self._fits(head.tokens, head.priority):
                return
            heapq.heappop(self._waiting)
            head.future.set_result(self._grant(head.request_id, head.tokens, head.priority))

    def position(self, request_id: str) -> int:
        """1-based place of a waiting request in admission order; 0 when it is not waiting."""
        ahead = sorted(w for w in self._waiting if not w.future.done())
        for index, waiter in enumerate(ahead, start=1):
            if waiter.request_id == request_id:
                return index
        return 0

    def snapshot(self) -> dict[str, int]:
        return {
            "kv_capacity_tokens": self.capacity_tokens,
            "kv_budget_tokens": self.budget_tokens,
            "kv_decode_reserve_tokens": self.decode_reserve_tokens,
            "kv_reserved_tokens": self.reserved_tokens,
            "admitted_requests": len(self._active),
            "waiting_for_admission": sum(1 for w in self._waiting if not w.future.done()),
        }
