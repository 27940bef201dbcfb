"""inference/engine/scheduling.py: the policies and the prefill lane (plain asyncio, no vLLM)."""

from __future__ import annotations

import asyncio

import pytest

from inference.engine.scheduling import PrefillLane, Scheduling, round_to_block
from tests.inference.asyncio_bodies import run, settle


def test_policies_switch_on_exactly_their_parts():
    assert (
        Scheduling.APPLIANCE.admission_control and Scheduling.APPLIANCE.prefill_lane and Scheduling.APPLIANCE.priorities
    )
    assert (
        not Scheduling.ENGINE.admission_control and not Scheduling.ENGINE.prefill_lane and Scheduling.ENGINE.priorities
    )
    assert not (Scheduling.FIFO.admission_control or Scheduling.FIFO.prefill_lane or Scheduling.FIFO.priorities)
    assert Scheduling("fifo") is Scheduling.FIFO


def test_round_to_block():
    assert round_to_block(100, 128) == 128
    assert round_to_block(128, 128) == 128
    assert round_to_block(129, 32) == 160
    assert round_to_block(0, 16) == 16


def test_the_turn_goes_to_the_document_with_the_least_prefill_left():
    async def body():
        lane = PrefillLane()
        order = []

        async def slice_of(name, remaining):
            await lane.acquire(remaining)
            order.append(name)

        await lane.acquire(512)  # a long document holds the lane
        short = asyncio.create_task(slice_of("short", 256))
        middle = asyncio.create_task(slice_of("middle", 384))
        await settle()
        assert lane.waiting == 2

        async def next_slice_of_the_long_one():
            lane.release()
            await lane.acquire(100)  # at once, as the engine host does: 100 tokens left
            order.append("long")

        await next_slice_of_the_long_one()  # the least left: it keeps its turn
        lane.release()  # the long one is done
        await settle()
        assert order == ["long", "short"] and not middle.done()
        lane.release()
        await settle()
        assert order == ["long", "short", "middle"]
        lane.release()
        await settle()
        assert lane.snapshot()["prefill_lane_busy"] == 0
        assert lane.slices == 4
        await asyncio.gather(short, middle)

    run(body)


def test_only_one_slice_holds_the_lane():
    async def body():
        lane = PrefillLane()
        await lane.acquire(100)
        second = asyncio.create_task(lane.acquire(1))
        await settle()
        assert not second.done() and lane.waiting == 1
        lane.release()
        await settle()
        assert second.done() and lane.snapshot()["prefill_lane_busy"] == 1
        lane.release()
        await settle()
        assert lane.snapshot()["prefill_lane_busy"] == 0

    run(body)


def test_no_document_slice_starts_while_drafting_and_the_lane_reopens_after():
    async def body():
        lane = PrefillLane(max_pause_s=60)
        lane.drafting_started()
        turn = asyncio.create_task(lane.acquire())
        await asyncio.sleep(0.05)
        assert not turn.done()
        assert lane.snapshot()["prefill_lane_waiting"] == 1
        lane.drafting_started()
        lane.drafting_finished()
        await settle()
        assert not turn.done()  # one drafter is still streaming
        lane.drafting_finished()
        await settle()
        assert turn.done()
        lane.release()

    run(body)


def test_a_document_gets_a_slice_after_max_pause_even_under_continuous_drafting():
    async def body():
        lane = PrefillLane(max_pause_s=0.2)
        lane.drafting_started()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await lane.acquire()
        waited = loop.time() - started
        assert 0.15 <= waited < 2
        lane.release()
        # The pause counts again from the end of that slice.
        started = loop.time()
        await lane.acquire()
        assert loop.time() - started >= 0.15
        lane.release()

    run(body)


def test_a_cancelled_waiter_gives_its_turn_back():
    async def body():
        lane = PrefillLane(max_pause_s=60)
        lane.drafting_started()
        turn = asyncio.create_task(lane.acquire())
        await settle()
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        lane.drafting_finished()
        await asyncio.wait_for(lane.acquire(), timeout=1)  # not deadlocked by the cancelled one
        lane.release()
        assert lane.snapshot()["prefill_lane_waiting"] == 0

    run(body)
