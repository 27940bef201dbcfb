"""vLLM's engine core sleeps, instead of spinning, while a step runs on a box with few cores
(``APPLIANCE_ENGINE_CORE_SPIN``; ``vllm_scheduler.stop_spinning``). Real vLLM queue parts, in
this process."""

from __future__ import annotations

import threading

import pytest


def test_auto_spins_only_on_a_box_with_cores_to_spare():
    from inference.engine.host import engine_core_spins

    assert engine_core_spins("auto", cpu_count=2) is False
    assert engine_core_spins("auto", cpu_count=8) is True
    assert engine_core_spins("on", cpu_count=2) is True
    assert engine_core_spins("off", cpu_count=64) is False


@pytest.fixture
def spin_condition(monkeypatch):
    """vLLM's ``SpinCondition`` class, its wait restored after the test (the patch is global)."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    monkeypatch.setattr(SpinCondition, "wait", SpinCondition.wait)
    monkeypatch.setattr(SpinCondition, "_appliance_sleeps", False, raising=False)
    return SpinCondition


def _reader_and_writer(spin_condition, context, address: str):
    writer = spin_condition(is_reader=False, context=context, notify_address=address)
    reader = spin_condition(is_reader=True, context=context, notify_address=address)
    return reader, writer


def _waits_until_notified(reader, writer) -> bool:
    """Whether ``reader.wait()`` right after a read blocks until the writer notifies it (True), or
    returns at once to be called again, spinning (False)."""
    reader.record_read()  # a message was just read: vLLM's spin window is open
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (reader.wait(timeout_ms=10_000), returned.set()), daemon=True)
    waiter.start()
    blocked = not returned.wait(0.3)
    writer.notify()
    assert returned.wait(10), "the reader was not woken by the writer's notification"
    return blocked


def test_a_reader_spins_after_a_message_until_told_to_sleep(spin_condition, tmp_path):
    import zmq

    from inference.engine.vllm_scheduler import stop_spinning

    context = zmq.Context()
    try:
        # Two queues' notifications (a notification a spinning reader never took would wake the
        # next wait of the same reader at once).
        spinning = _reader_and_writer(spin_condition, context, f"ipc://{tmp_path}/a")
        sleeping = _reader_and_writer(spin_condition, context, f"ipc://{tmp_path}/b")
        assert _waits_until_notified(*spinning) is False  # vLLM as it is: a second of spinning
        assert stop_spinning() is True
        assert stop_spinning() is False  # once per process
        # A reader made before the call sleeps now, and the writer's notification wakes it.
        assert _waits_until_notified(*sleeping) is True
    finally:
        context.destroy(linger=0)
