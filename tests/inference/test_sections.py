"""A long document's sections run several at a time (``running.map_sections``): answers in section
order whatever order they finish in, never more at once than the prefill queue's cap, progress
with an ETA, and one failure closes the others. The engine side is a fake (``FakeSectionResult``
answers a request after a delay); the threads, the group and the ordering are the real code."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from django.test import override_settings

from inference import running
from inference.engine.client import EngineRestarting
from inference.engine.protocol import GenerateRequest, Priority


def _requests(n: int) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            request_id=f"job-{i}",
            messages=[{"role": "user", "content": f"section {i} " * (10 + i)}],
            max_tokens=8,
            priority=Priority.PREFILL,
        )
        for i in range(n)
    ]


class FakeSectionResult(running.TaskResult):
    """Answers each request after the delay its section is given, or fails the one told to;
    counts how many run at once. A request waits on the group's abort like an engine stream."""

    def __init__(self, delays: dict[int, float], fail: int | None = None) -> None:
        super().__init__()
        self.delays, self.fail = delays, fail
        self.running = self.most_at_once = 0
        self.started: list[int] = []
        self.closed_early: list[int] = []
        self.count_lock = threading.Lock()

    def run_hidden(self, job, client, attempt, request, group=None) -> str:
        index = int(request.request_id.split("-")[1])
        group.check()
        closed = threading.Event()
        group.opened(closed.set)
        with self.count_lock:
            self.started.append(index)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            if index == self.fail:
                time.sleep(0.05)
                raise EngineRestarting("the engine core died", in_flight=True)
            if closed.wait(self.delays.get(index, 0.01)):
                self.closed_early.append(index)
                raise running.SectionAbandoned()
            return f"answer {index}"
        finally:
            group.closed(closed.set)
            with self.count_lock:
                self.running -= 1


@pytest.fixture
def said(monkeypatch):
    steps: list[str] = []
    monkeypatch.setattr(running, "_progress", lambda attempt, step: steps.append(step))
    return steps


def _job():
    return SimpleNamespace(pk=1, checkpoint={})


def _attempt():
    return SimpleNamespace(check=lambda: None)


@override_settings(APPLIANCE_PREFILL_CONCURRENCY=2)
def test_sections_run_up_to_the_cap_at_once_and_answer_in_section_order(said):
    result = FakeSectionResult(delays={0: 0.3, 1: 0.05, 2: 0.05, 3: 0.05})
    answers = running.map_sections(_job(), None, _attempt(), result, _requests(4), doing="Reading")
    assert answers == ["answer 0", "answer 1", "answer 2", "answer 3"]  # 0 finished last
    assert result.most_at_once == 2
    assert said[0] == "Reading: 4 parts, 2 at a time"
    assert any(step.startswith("Reading: 3 of 4 parts done, about") and step.endswith(" left") for step in said), said


@override_settings(APPLIANCE_PREFILL_CONCURRENCY=1)
def test_with_a_cap_of_one_sections_run_one_after_another(said):
    result = FakeSectionResult(delays={})
    assert running.map_sections(_job(), None, _attempt(), result, _requests(3), doing="Reading") == [
        "answer 0",
        "answer 1",
        "answer 2",
    ]
    assert result.most_at_once == 1 and result.started == [0, 1, 2]


@override_settings(APPLIANCE_PREFILL_CONCURRENCY=2)
def test_one_failing_section_closes_the_one_beside_it_and_the_rest_never_start(said):
    result = FakeSectionResult(delays={1: 30.0}, fail=0)
    started = time.monotonic()
    with pytest.raises(EngineRestarting):
        running.map_sections(_job(), None, _attempt(), result, _requests(5), doing="Reading")
    assert time.monotonic() - started < 10  # section 1 was closed, not waited for
    assert result.closed_early == [1]
    assert set(result.started) <= {0, 1, 2}  # at most one more started before the group was abandoned
    assert 3 not in result.started and 4 not in result.started


def test_a_section_group_closes_requests_opened_after_it_was_abandoned():
    group = running.SectionGroup()
    closed = []
    group.opened(lambda: closed.append("first"))
    group.abandon()
    assert closed == ["first"]
    group.opened(lambda: closed.append("late"))
    assert closed == ["first", "late"]
    with pytest.raises(running.SectionAbandoned):
        group.check()
