"""Means with 95 % confidence intervals over a benchmark's repeats. Pure.

The machines the appliance is measured on are shared and noisy, so a benchmark repeats each
measurement and reports the mean of the per-repeat ratios with a Student-t interval, rather
than one run's figure; a ratio of tail percentiles is also given over the repeats' requests
pooled, with a bootstrap interval (``pooled_ratio``).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom (then the normal's).
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
          2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
          2.045, 2.042)  # fmt: skip


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    def to_dict(self, digits: int = 3) -> dict[str, Any]:
        return {"mean": round(self.mean, digits), "low": round(self.low, digits), "high": round(self.high, digits),
                "n": self.n}  # fmt: skip

    def __str__(self) -> str:
        if self.n < 2:
            return f"{self.mean:.3g}"
        return f"{self.mean:.3g} [{self.low:.3g}, {self.high:.3g}]"


def t_975(degrees_of_freedom: int) -> float:
    if degrees_of_freedom < 1:
        raise ValueError("an interval needs at least two values")
    return _T_975[degrees_of_freedom - 1] if degrees_of_freedom <= len(_T_975) else 1.96


def interval(values: list[float | None]) -> Interval | None:
    """The mean of ``values`` (None dropped) and its 95 % interval; a single value is its own."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    mean = statistics.fmean(present)
    if len(present) == 1:
        return Interval(mean, mean, mean, 1)
    half = t_975(len(present) - 1) * statistics.stdev(present) / math.sqrt(len(present))
    return Interval(mean, mean - half, mean + half, len(present))


def percentile_bootstrap(
    resample: Callable[[random.Random], float | None], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of ``resample(rng)`` over ``resamples`` draws (a draw
    that gives None is dropped), with a seeded generator: a percentile-bootstrap 95 % interval,
    whatever ``resample`` draws. None when no draw gives a value."""
    rng = random.Random(seed)  # noqa: S311 - a resampling, not a secret
    values = sorted(value for _ in range(resamples) if (value := resample(rng)) is not None)
    if not values:
        return None
    return values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]


def pooled_ratio(
    numerators: Sequence[Sequence[float]],
    denominators: Sequence[Sequence[float]],
    statistic: Callable[[list[float]], float | None],
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval | None:
    """``statistic`` of every repeat's numerator values pooled over ``statistic`` of the
    denominators pooled, with a percentile-bootstrap 95 % interval: each repeat's values are
    resampled with replacement within that repeat (its share of the pool stays the same), both
    sides independently. For a tail statistic such as a p95 this rests on all the requests of
    the run: a per-repeat p95 from 60 requests is about its fourth slowest, and one stall of
    the machine moves it (the per-repeat interval then spans the target whatever the policy).
    The interval is of the requests' sampling only: it holds the repeats as they were, so it is
    narrower than one that would also count the noise between repeats (the per-repeat interval
    does), and requests caught together by one stall count as independent. ``n`` is the
    numerator's count of values."""
    tops = [list(group) for group in numerators if group]
    bottoms = [list(group) for group in denominators if group]
    if not tops or not bottoms:
        return None

    def ratio(top: list[list[float]], bottom: list[list[float]]) -> float | None:
        a = statistic([v for group in top for v in group])
        b = statistic([v for group in bottom for v in group])
        return a / b if a is not None and b else None

    point = ratio(tops, bottoms)
    if point is None:
        return None
    bounds = percentile_bootstrap(
        lambda rng: ratio(
            [rng.choices(group, k=len(group)) for group in tops],
            [rng.choices(group, k=len(group)) for group in bottoms],
        ),
        resamples=resamples,
        seed=seed,
    )
    if bounds is None:
        return None
    low, high = bounds
    return Interval(point, low, high, sum(len(group) for group in tops))


def meets(value: Interval | None, target: float, *, below: bool) -> str:
    """``met`` when the whole interval is on the right side of the target, ``missed`` when the
    whole of it is on the wrong side, ``unclear`` when the interval straddles it."""
    if value is None:
        return "not measured"
    good_low = value.low <= target if below else value.low >= target
    good_high = value.high <= target if below else value.high >= target
    if good_low and good_high:
        return "met"
    if not good_low and not good_high:
        return "missed"
    return "unclear"


def format_entry(entry: dict[str, Any] | None, *, digits: int = 2, missing: str = "-") -> str:
    """An ``Interval.to_dict()`` as a table shows it: the mean, and [low, high] from two values on."""
    if not entry:
        return missing
    if entry["n"] < 2:
        return f"{entry['mean']:.{digits}f}"
    return f"{entry['mean']:.{digits}f} [{entry['low']:.{digits}f}, {entry['high']:.{digits}f}]"
