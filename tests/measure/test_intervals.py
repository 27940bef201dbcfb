"""Means and 95 % intervals over a benchmark's repeats."""

from __future__ import annotations

import pytest

from inference.timing import percentile
from measure.intervals import interval, meets, pooled_ratio, t_975


def test_an_interval_is_the_students_t_interval_of_the_mean():
    iv = interval([1.0, 2.0, 3.0])
    assert iv.mean == 2.0 and iv.n == 3
    # stdev 1, n 3, t(2) = 4.303: half-width 4.303 / sqrt(3) = 2.484
    assert iv.low == pytest.approx(2.0 - 2.4843, abs=1e-3) and iv.high == pytest.approx(2.0 + 2.4843, abs=1e-3)


def test_missing_values_are_dropped_and_one_value_is_its_own_interval():
    assert interval([None, None]) is None
    iv = interval([None, 0.8])
    assert (iv.mean, iv.low, iv.high, iv.n) == (0.8, 0.8, 0.8, 1)


def test_t_quantiles():
    assert t_975(1) == 12.706 and t_975(2) == 4.303 and t_975(100) == 1.96
    with pytest.raises(ValueError):
        t_975(0)


def test_a_target_is_met_only_when_the_whole_interval_clears_it():
    assert meets(interval([0.95, 0.96, 0.97]), 0.9, below=False) == "met"
    assert meets(interval([0.5, 0.6, 0.7]), 0.9, below=False) == "missed"
    assert meets(interval([0.8, 0.9, 1.0]), 0.9, below=False) == "unclear"
    assert meets(interval([1.2, 1.3, 1.25]), 1.5, below=True) == "met"
    assert meets(None, 1.5, below=True) == "not measured"


def _p95(values: list[float]) -> float | None:
    return percentile(values, 95)


def test_a_pooled_ratio_is_the_statistic_of_all_requests_with_a_bootstrap_interval():
    alone = [[100.0 + i for i in range(100)] for _ in range(3)]  # p95 of the pool: 194.05
    beside = [[2 * v for v in group] for group in alone]
    iv = pooled_ratio(beside, alone, _p95, seed=1)
    assert iv.mean == pytest.approx(2.0) and iv.n == 300
    assert iv.low < 2.0 < iv.high and iv.high - iv.low < 0.3  # 300 requests a side: a narrow interval
    assert pooled_ratio(beside, alone, _p95, seed=1) == iv  # seeded: the same interval again


def test_one_stall_moves_a_pooled_p95_less_than_it_moves_one_repeats():
    """Three repeats of 60 requests alone, one with four requests caught in a 600 ms stall:
    that repeat's own p95 ratio falls to about a third (0.33, the truth being 1.5), the pooled
    one stays near the truth."""
    same = [100.0 + i for i in range(60)]
    stalled = same[:56] + [700.0] * 4
    beside = [[v * 1.5 for v in same] for _ in range(3)]
    per_repeat = [_p95(b) / _p95(a) for b, a in zip(beside, [same, same, stalled], strict=True)]
    assert per_repeat[2] < 0.5 < 1.4 < per_repeat[0]
    pooled = pooled_ratio(beside, [same, same, stalled], _p95, seed=2)
    assert 1.3 < pooled.mean < 1.6


def test_a_pooled_ratio_needs_values_on_both_sides():
    assert pooled_ratio([], [[1.0]], _p95) is None
    assert pooled_ratio([[1.0]], [[]], _p95) is None
    assert pooled_ratio([[1.0]], [[0.0]], _p95) is None  # a zero denominator has no ratio
