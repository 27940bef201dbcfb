"""Means with 95 % confidence intervals over a benchmark's repeats. Pure.

The machines the appliance is measured on are shared and noisy, so a benchmark repeats each
measurement and reports the mean of the per-repeat ratios with a Student-t interval, rather
than one run's figure.
"""

from __future__ import annotations

import math
import statistics
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
