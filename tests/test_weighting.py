"""Aggregation candidates and the bandit's memory, checked on hand-computed inputs."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.round.aggregation import mix_and_cap, round_weights
from fedowen_strategy.selectors.adaptive import update_memory


def test_cap_moves_the_excess_to_the_others_in_proportion() -> None:
    # 0.7 capped at 0.4: excess 0.3 split 2:1 over 0.2 and 0.1 -> 0.4, 0.4, 0.2
    w = mix_and_cap(np.array([0.7, 0.2, 0.1]), cap=0.4)
    np.testing.assert_allclose(w, [0.4, 0.4, 0.2])
    # a second pass: 0.9 capped at 0.35 pushes 0.08 -> 0.44 > cap, which is capped in turn
    w = mix_and_cap(np.array([0.9, 0.08, 0.02]), cap=0.35)
    np.testing.assert_allclose(w, [0.35, 0.35, 0.30])
    assert w.max() <= 0.35 + 1e-12 and w.sum() == pytest.approx(1.0)


def test_mix_and_infeasible_cap() -> None:
    np.testing.assert_allclose(mix_and_cap(np.array([1.0, 0.0]), uniform_mix=0.5), [0.75, 0.25])
    np.testing.assert_allclose(mix_and_cap(np.array([0.9, 0.1, 0.0]), cap=0.3), [1 / 3] * 3)
    with pytest.raises(ValueError, match="cap"):
        mix_and_cap(np.array([1.0]), cap=0.0)


@pytest.mark.parametrize("phi", [[0.0, 0.0, 0.0], [1e300, -1e300, 0.0], [-1.0, -2.0, -3.0],
                                 [50.0, 0.0, -50.0]])
def test_positive_aggregation_never_nan_and_sums_to_one(phi: list[float]) -> None:
    for cap in (1.0, 0.5):
        w = mix_and_cap(round_weights("positive", np.array(phi), [1, 1, 1], 0.1), 0.1, cap)
        assert np.all(np.isfinite(w)) and w.sum() == pytest.approx(1.0) and w.max() <= cap


def test_positive_aggregation_by_hand() -> None:
    w = round_weights("positive", np.array([np.log(3.0), -0.2, 0.0]), [1, 1, 1])
    np.testing.assert_allclose(w, [1.0, 0.0, 0.0])
    w = round_weights("positive", np.array([np.log(3.0), np.log(1.0) + 1e-12, -1.0]), [1, 1, 1])
    np.testing.assert_allclose(w, [0.75, 0.25, 0.0], rtol=1e-9)
    np.testing.assert_allclose(round_weights("positive", np.array([-1.0, 0.0]), [1, 1]),
                               [0.5, 0.5])


def test_bandit_memory_by_hand() -> None:
    # phi sequence 0.3, 0.1, 0.5: mean 0.3, 0.2, 0.3; discounted (0.5): 0.3, 0.2, 0.35
    mean = disc = None
    means, discs = [], []
    for count, phi in enumerate([0.3, 0.1, 0.5], start=1):
        mean = update_memory(mean, phi, count, "mean")
        disc = update_memory(disc, phi, count, "discounted", 0.5)
        means.append(mean)
        discs.append(disc)
    np.testing.assert_allclose(means, [0.3, 0.2, 0.3])
    np.testing.assert_allclose(discs, [0.3, 0.2, 0.35])
    assert update_memory(0.9, 0.1, 5, "latest") == 0.1
    with pytest.raises(ValueError, match="memory"):
        update_memory(None, 0.1, 1, "median")
