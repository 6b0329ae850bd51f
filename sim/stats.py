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


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison over seeds: the mean difference with its interval, the two-sided
    paired t-test's p and, beside it, the Wilcoxon signed-rank test's and the exact sign
    test's."""

    diff: Interval
    p_t: float
    p_wilcoxon: float
    p_sign: float = math.nan


def paired_test(values: Mapping[int, float], reference: Mapping[int, float],
                confidence: float = CONFIDENCE) -> PairedTest:
    """``values[s] - reference[s]`` over the seeds both have: interval, paired t, Wilcoxon
    (exact where scipy can) and the exact two-sided sign test over the non-zero differences
    (NaN with fewer than two seeds or no spread)."""
    seeds = sorted(set(values) & set(reference))
    diffs = np.array([values[s] - reference[s] for s in seeds], dtype=float)
    interval = mean_interval(diffs.tolist(), confidence)
    if diffs.size < 2 or not np.any(diffs):
        return PairedTest(interval, math.nan, math.nan)
    p_t = float(stats.ttest_1samp(diffs, 0.0).pvalue) if np.ptp(diffs) > 0 else 0.0
    p_w = float(stats.wilcoxon(diffs).pvalue)
    signs = diffs[diffs != 0]
    p_s = float(stats.binomtest(int(np.sum(signs > 0)), int(signs.size)).pvalue)
    return PairedTest(interval, p_t, p_w, p_s)


def smallest_exact_p(n: int) -> float:
    """The smallest two-sided p an exact sign or Wilcoxon signed-rank test can give over ``n``
    paired seeds: every difference of one sign, ``2 / 2**n``."""
    return 2.0 / 2**n


def seeds_for_holm(m: int, level: float = 0.05) -> int:
    """The fewest seeds with which an exact sign or Wilcoxon test can pass Holm's strictest
    step among ``m`` hypotheses (``smallest_exact_p(n) < level / m``): 11 for 32 primaries."""
    n = 1
    while smallest_exact_p(n) >= level / m:
        n += 1
    return n


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order.

    Sorted ascending, the i-th smallest (1-based) of m becomes ``max over j <= i of
    min(1, (m - j + 1) p_(j))``; rejecting where the adjusted p is below alpha controls the
    family-wise error at alpha. A NaN p (no test) stays NaN and does not count in m.
    """
    finite = [(p, i) for i, p in enumerate(pvalues) if not math.isnan(p)]
    m = len(finite)
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(finite)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted
