"""inference/tasks.py: the retry schedule while the engine host is down (pure)."""

from __future__ import annotations

from inference.tasks import engine_retry_delays_s


def test_retries_back_off_then_keep_trying_every_30_s_for_the_whole_window():
    delays = engine_retry_delays_s(600)
    assert delays[:5] == [2, 4, 8, 16, 30]
    assert set(delays[4:]) == {30}
    assert sum(delays) >= 600 > sum(delays[:-1])


def test_no_window_means_no_retry():
    assert engine_retry_delays_s(0) == []
