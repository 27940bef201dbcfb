"""inference/engine/admission.py: KV-cache admission (plain asyncio, no vLLM)."""

from __future__ import annotations

import asyncio

import pytest

from inference.engine.admission import AdmissionRefused, KvAdmission, Reservation
from tests.inference.asyncio_bodies import run, settle

DECODE, PREFILL = 0, 10


def make(capacity=1000, **kwargs) -> KvAdmission:
    # safety_factor=1.0 keeps the arithmetic readable: budget 1000, decode reserve 100,
    # so prefill requests may fill 900 tokens and decode requests all 1000.
    kwargs.setdefault("safety_factor", 1.0)
    kwargs.setdefault("decode_reserve_fraction", 0.1)
    return KvAdmission(capacity, **kwargs)


def test_budget_and_reserve_arithmetic():
    admission = KvAdmission(1000)  # defaults: safety 0.9, reserve 10 %
    assert admission.budget_tokens == 900
    assert admission.decode_reserve_tokens == 90
    assert admission.limit_for(DECODE) == 900
    assert admission.limit_for(PREFILL) == 810


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        KvAdmission(0)


def test_grants_within_budget():
    async def body():
        admission = make()
        first = await admission.acquire("a", 300, PREFILL)
        second = await admission.acquire("b", 600, PREFILL)
        assert first == Reservation("a", 300, PREFILL)
        assert second == Reservation("b", 600, PREFILL)
        assert admission.reserved_tokens == 900
        assert admission.snapshot()["admitted_requests"] == 2

    run(body)


def test_request_over_the_limit_is_refused_at_once():
    async def body():
        admission = make()
        with pytest.raises(AdmissionRefused, match="900"):
            await admission.acquire("too-big-prefill", 901, PREFILL)
        with pytest.raises(AdmissionRefused):
            await admission.acquire("too-big-decode", 1001, DECODE)
        assert admission.reserved_tokens == 0
        assert admission.snapshot()["waiting_for_admission"] == 0

    run(body)


def test_request_over_the_limit_is_refused_even_when_the_budget_is_busy():
    async def body():
        admission = make()
        await admission.acquire("a", 500, PREFILL)
        with pytest.raises(AdmissionRefused):
            await admission.acquire("never", 950, PREFILL)  # would wait forever otherwise
        assert admission.snapshot()["waiting_for_admission"] == 0

    run(body)


def test_prefill_may_fill_exactly_its_limit_and_decode_the_whole_budget():
    async def body():
        admission = make()
        await admission.acquire("prefill", 900, PREFILL)
        await admission.acquire("decode", 100, DECODE)
        assert admission.reserved_tokens == 1000

    run(body)


def test_prefill_cannot_use_the_decode_reserve():
    async def body():
        admission = make()
        held = await admission.acquire("held", 850, PREFILL)
        waiting = asyncio.create_task(admission.acquire("p2", 60, PREFILL))  # 910 > 900
        await settle()
        assert not waiting.done()
        assert admission.reserved_tokens == 850
        assert admission.snapshot()["waiting_for_admission"] == 1
        admission.release(held)
        reservation = await waiting
        assert reservation.request_id == "p2"
        assert admission.reserved_tokens == 60

    run(body)


def test_decode_can_use_the_decode_reserve():
    async def body():
        admission = make()
        await admission.acquire("held", 900, PREFILL)  # prefill's share is full
        decode = await admission.acquire("d1", 100, DECODE)  # granted without waiting
        assert decode.tokens == 100
        assert admission.reserved_tokens == 1000

    run(body)


def test_decode_that_fits_is_not_held_behind_a_waiting_prefill():
    """The reserve exists "so that a drafter can always start". A decode request that fits must
    not wait behind a prefill request that does not (a lower priority waiter)."""

    async def body():
        admission = make()
        held = await admission.acquire("held", 850, PREFILL)
        prefill = asyncio.create_task(admission.acquire("p-waiting", 100, PREFILL))  # 950 > 900
        await settle()
        assert not prefill.done()
        decode = asyncio.create_task(admission.acquire("d1", 100, DECODE))  # 950 <= 1000: fits
        await settle()
        try:
            assert decode.done(), "a decode request that fits waited behind a lower-priority prefill waiter"
            assert admission.reserved_tokens == 950
        finally:
            admission.release(held)
            await asyncio.gather(prefill, decode)

    run(body)


def test_waiters_are_admitted_in_priority_order():
    async def body():
        admission = make()
        full = await admission.acquire("full", 1000, DECODE)
        granted: list[str] = []

        async def acquire(request_id, tokens, priority):
            reservation = await admission.acquire(request_id, tokens, priority)
            granted.append(request_id)
            return reservation

        prefill = asyncio.create_task(acquire("prefill", 400, PREFILL))  # waits first
        await settle()
        decode = asyncio.create_task(acquire("decode", 700, DECODE))  # waits second
        await settle()
        assert granted == []
        admission.release(full)
        await settle()
        # Decode (priority 0) goes first although it came later; then prefill no longer fits
        # (700 + 400 > 900). In arrival order prefill would have been admitted and decode not.
        assert granted == ["decode"]
        assert not prefill.done()
        admission.release(decode.result())
        await settle()
        assert granted == ["decode", "prefill"]

    run(body)


def test_same_priority_waiters_are_admitted_in_arrival_order():
    async def body():
        admission = make()
        full = await admission.acquire("full", 900, PREFILL)
        tasks = [asyncio.create_task(admission.acquire(f"r{i}", 300, PREFILL)) for i in range(4)]
        await settle()
        admission.release(full)
        await settle()
        assert [t.done() for t in tasks] == [True, True, True, False]

    run(body)


def test_large_head_waiter_is_not_starved_by_smaller_later_ones():
    async def body():
        admission = make()
        a = await admission.acquire("a", 500, PREFILL)
        b = await admission.acquire("b", 400, PREFILL)
        large = asyncio.create_task(admission.acquire("large", 600, PREFILL))
        await settle()
        small = asyncio.create_task(admission.acquire("small", 100, PREFILL))
        await settle()
        admission.release(b)  # 500 reserved: small would fit (600), large does not (1100)
        await settle()
        assert not large.done()
        assert not small.done(), "a later small request overtook the large one at the head"
        late_small = asyncio.create_task(admission.acquire("late-small", 50, PREFILL))
        await settle()
        assert not late_small.done(), "a new request jumped the queue"
        admission.release(a)
        await settle()
        assert large.done() and small.done() and late_small.done()
        assert admission.reserved_tokens == 750

    run(body)


def test_cancelling_a_waiting_acquire_removes_it_and_wakes_the_next():
    async def body():
        admission = make()
        await admission.acquire("held", 500, PREFILL)
        blocked = asyncio.create_task(admission.acquire("blocked", 500, PREFILL))  # 1000 > 900
        await settle()
        behind = asyncio.create_task(admission.acquire("behind", 100, PREFILL))  # fits, but queued
        await settle()
        assert not behind.done()
        assert admission.snapshot()["waiting_for_admission"] == 2
        blocked.cancel()
        await settle()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert behind.done()
        assert behind.result().request_id == "behind"
        assert admission.reserved_tokens == 600
        assert admission.snapshot()["waiting_for_admission"] == 0
        assert admission._waiting == []

    run(body)


def test_cancel_and_release_in_the_same_step():
    """A waiter is cancelled (client went away) and, before its task runs again, another request
    finishes. The cancelled acquire must still end in CancelledError, not another exception."""

    async def body():
        admission = make()
        full = await admission.acquire("full", 1000, DECODE)
        cancelled = asyncio.create_task(admission.acquire("gone", 500, PREFILL))
        await settle()
        nxt = asyncio.create_task(admission.acquire("next", 400, PREFILL))
        await settle()
        cancelled.cancel()
        admission.release(full)  # same step: _wake sees the cancelled future first
        await settle()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert nxt.done() and nxt.result().request_id == "next"
        assert admission.reserved_tokens == 400

    run(body)


def test_cancel_after_grant_releases_the_reservation():
    async def body():
        admission = make()
        full = await admission.acquire("full", 1000, DECODE)
        task = asyncio.create_task(admission.acquire("late", 300, PREFILL))
        await settle()
        admission.release(full)  # grants "late" (its future gets a result)...
        task.cancel()  # ...but the task is cancelled before it can return it
        with pytest.raises(asyncio.CancelledError):
            await task
        assert admission.reserved_tokens == 0
        assert admission.snapshot()["admitted_requests"] == 0

    run(body)


def test_double_release_is_harmless():
    async def body():
        admission = make()
        first = await admission.acquire("a", 300, PREFILL)
        await admission.acquire("b", 200, PREFILL)
        admission.release(first)
        admission.release(first)
        assert admission.reserved_tokens == 200
        assert admission.snapshot()["admitted_requests"] == 1

    run(body)


def test_release_of_unknown_reservation_is_ignored():
    async def body():
        admission = make()
        await admission.acquire("a", 300, PREFILL)
        admission.release(Reservation("never-granted", 300, PREFILL))
        assert admission.reserved_tokens == 300

    run(body)


def test_snapshot_numbers():
    async def body():
        admission = KvAdmission(2000, safety_factor=0.5, decode_reserve_fraction=0.2)
        assert admission.snapshot() == {
            "kv_capacity_tokens": 2000,
            "kv_budget_tokens": 1000,
            "kv_decode_reserve_tokens": 200,
            "kv_reserved_tokens": 0,
            "admitted_requests": 0,
            "waiting_for_admission": 0,
        }
        await admission.acquire("a", 500, PREFILL)
        await admission.acquire("b", 250, DECODE)
        waiter = asyncio.create_task(admission.acquire("c", 300, PREFILL))  # 1050 > 800
        await settle()
        snapshot = admission.snapshot()
        assert snapshot["kv_reserved_tokens"] == 750
        assert snapshot["admitted_requests"] == 2
        assert snapshot["waiting_for_admission"] == 1
        waiter.cancel()
        await settle()
        assert admission.snapshot()["waiting_for_admission"] == 0

    run(body)


def test_position_reports_place_in_admission_order():
    async def body():
        admission = make()
        await admission.acquire("big", 900, PREFILL)
        doc = asyncio.create_task(admission.acquire("doc", 500, PREFILL))
        draft = asyncio.create_task(admission.acquire("draft", 500, DECODE))
        await settle()
        # The drafter is ahead of the document that arrived before it: priority first.
        assert admission.position("draft") == 1
        assert admission.position("doc") == 2
        assert admission.position("big") == 0  # admitted, not waiting
        admission.release(Reservation("big", 900, PREFILL))
        await settle()
        assert draft.done() and admission.position("draft") == 0
        # 500 + 500 is over the 900 a document may fill: it moves up to first place and waits.
        assert admission.position("doc") == 1 and not doc.done()
        doc.cancel()

    run(body)
