"""inference/attempts.py: an attempt's deadline and stop reasons (pure; the clock is a fake)."""

from __future__ import annotations

import pytest

from inference.attempts import Attempt, AttemptStopped, StopReason, time_limit_reason


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_deadline_stops_the_attempt_and_closes_its_open_request():
    clock = FakeClock()
    attempt = Attempt.starting_now("job", 1, limit_s=60, clock=clock)
    closed = []
    attempt.opened(lambda: closed.append("request"))
    clock.now += 59
    attempt.check()  # still in time
    assert attempt.remaining_s() == pytest.approx(1)
    clock.now += 1
    with pytest.raises(AttemptStopped) as stopped:
        attempt.check()
    assert stopped.value.reason is StopReason.DEADLINE
    assert closed == ["request"]


def test_the_first_reason_wins_and_every_later_check_raises_it():
    attempt = Attempt.starting_now("job", 3, limit_s=60, clock=FakeClock())
    attempt.stop(StopReason.CLAIM_LOST)
    attempt.stop(StopReason.CANCELLED)
    for _ in range(2):
        with pytest.raises(AttemptStopped) as stopped:
            attempt.check()
        assert stopped.value.reason is StopReason.CLAIM_LOST


def test_a_request_opened_after_the_stop_is_closed_at_once_and_a_closed_one_is_left_alone():
    attempt = Attempt.starting_now("job", 1, limit_s=60, clock=FakeClock())
    closed = []

    def first():
        closed.append("first")

    attempt.opened(first)
    attempt.closed(first)
    attempt.stop(StopReason.CANCELLED)
    assert closed == []  # no longer open: not closed again
    attempt.opened(lambda: closed.append("late"))
    assert closed == ["late"]


def test_the_time_limit_reason_says_how_long_and_what_to_do():
    assert "30 minutes" in time_limit_reason(1800)
    assert "45 seconds" in time_limit_reason(45)
    assert "APPLIANCE_JOB_TIME_LIMIT_S" in time_limit_reason(600)
