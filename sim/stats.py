"""Confidence intervals over seeds: means, and paired differences on the same seeds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` seeds and the half-width of its two-sided Student-t interval."""

    mean: float
    half: float
    n: int

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half

    @property
    def excludes_zero(self) -> bool:
        return self.n > 1 and (self.lo > 0 or self.hi < 0)

    def text(self, signed: bool = False) -> str:
        """``84.12 ± 1.03`` (``+1.20 ± 0.80`` when signed); ``-`` without values."""
        if not self.n:
            return "-"
        mean = f"{self.mean:+.2f}" if signed else f"{self.mean:.2f}"
        return f"{mean} ± {self.half:.2f}" if self.n > 1 else f"{mean} (n=1)"


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean and t-interval half-width of ``values`` (half-width NaN for one value)."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if arr.size == 0:
        return Interval(math.nan, math.nan, 0)
    if arr.size == 1:
        return Interval(float(arr[0]), math.nan, 1)
    t = float(stats.t.ppf(0.5 + confidence / 2, arr.size - 1))
    return Interval(float(arr.mean()), t * float(arr.std(ddof=1)) / math.sqrt(arr.size),
                    int(arr.size))


def paired_interval(values: Mapping[int, float], reference: Mapping[int, float],
                    confidence: float = CONFIDENCE) -> Interval:
    """Interval of the mean of ``values[s] - reference[s]`` over the seeds ``s`` both have."""
    seeds = sorted(set(values) & set(reference))
    return mean_interval([values[s] - reference[s] for s in seeds], confidence)
