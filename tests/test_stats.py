"""Tests for sim.stats: the paired tests and Holm's correction of the confirmation."""

from __future__ import annotations

import math

import pytest

from sim.stats import holm, paired_test


def test_holm_by_hand() -> None:
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1, but monotone: 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1, and the running maximum keeps the order of the raw p-values
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    # a comparison without a test counts in no family
    adjusted = holm([math.nan, 0.2, 0.5])
    assert math.isnan(adjusted[0]) and adjusted[1:] == pytest.approx([0.4, 0.5])
    assert holm([]) == []


def test_paired_test_by_hand() -> None:
    values, reference = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 9: 100.0}, {s: 0.0 for s in range(4)}
    result = paired_test(values, reference)  # seed 9 has no partner and is left out
    assert result.diff.n == 4 and result.diff.mean == pytest.approx(2.5)
    # t = 2.5 / (1.2910 / 2) = 3.873 on 3 degrees of freedom: two-sided p = 0.0305
    assert result.p_t == pytest.approx(0.0305, abs=5e-4)
    # Wilcoxon, exact: all four ranks positive has probability 1/16, two-sided 2/16
    assert result.p_wilcoxon == pytest.approx(0.125)
    assert result.diff.lo == pytest.approx(2.5 - 3.1824 * 1.2910 / 2, abs=1e-3)
    # no difference at all: no test
    same = paired_test({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0})
    assert math.isnan(same.p_t) and math.isnan(same.p_wilcoxon)
