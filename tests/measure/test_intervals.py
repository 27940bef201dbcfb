"""Means and 95 % intervals over a benchmark's repeats."""

from __future__ import annotations

import pytest

from measure.intervals import interval, meets, t_975


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
