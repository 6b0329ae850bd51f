"""Softmax(contribution) weights and weighted averages of state dicts."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.round.aggregation import (
    example_weights,
    round_weights,
    softmax_weights,
    spread_weights,
    weighted_average,
)
from fedowen_strategy.round.contribution import aggregation_problems


def test_softmax_weights_by_hand() -> None:
    # exp(0)=1, exp(ln 3)=3 -> weights 1/4, 3/4 at T=1; at T=2 -> 1, sqrt(3)
    np.testing.assert_allclose(softmax_weights(np.array([0.0, np.log(3.0)])), [0.25, 0.75])
    w = softmax_weights(np.array([0.0, np.log(3.0)]), temperature=2.0)
    np.testing.assert_allclose(w, [1 / (1 + np.sqrt(3)), np.sqrt(3) / (1 + np.sqrt(3))])


def test_softmax_is_stable_for_large_values() -> None:
    w = softmax_weights(np.array([1000.0, 1000.0, 0.0]))
    np.testing.assert_allclose(w, [0.5, 0.5, 0.0], atol=1e-300)


@pytest.mark.parametrize("phi", [[np.nan, 0.0], [np.inf, 1.0]])
def test_softmax_refuses_non_finite(phi: list[float]) -> None:
    with pytest.raises(ValueError, match="finite"):
        softmax_weights(np.array(phi))


def test_softmax_refuses_bad_temperature() -> None:
    with pytest.raises(ValueError, match="temperature=0"):
        softmax_weights(np.array([0.1]), temperature=0)


def test_weighted_average_by_hand() -> None:
    # Prepare
    a = {"w": np.array([[1.0, 2.0]], np.float32), "n": np.array(10, np.int64)}
    b = {"w": np.array([[3.0, 6.0]], np.float32), "n": np.array(20, np.int64)}
    # Execute
    out = weighted_average([a, b], np.array([0.25, 0.75]))
    # Assert: 0.25*1+0.75*3 = 2.5, 0.25*2+0.75*6 = 5; integer buffer rounded 17.5 -> 18
    np.testing.assert_allclose(out["w"], [[2.5, 5.0]])
    assert out["w"].dtype == np.float32
    assert out["n"] == 18 and out["n"].dtype == np.int64


def test_weighted_average_checks_weights() -> None:
    s = {"w": np.zeros(2)}
    with pytest.raises(ValueError, match="sum to 1"):
        weighted_average([s, s], np.array([0.5, 0.6]))
    with pytest.raises(ValueError, match="2 states but 1 weights"):
        weighted_average([s, s], np.array([1.0]))


def test_example_weights() -> None:
    np.testing.assert_allclose(example_weights([10, 30]), [0.25, 0.75])
    with pytest.raises(ValueError, match="positive"):
        example_weights([10, 0])


def test_spread_weights_are_softmax_of_phis_z_scores_by_hand() -> None:
    # Prepare: phi 0.1, 0.2, 0.3: sd = 0.1 sqrt(2/3), so neighbours are sqrt(3/2) sds apart
    phi = np.array([0.1, 0.2, 0.3])
    # Execute
    at_1, at_2 = spread_weights(phi, 1.0), spread_weights(phi, 2.0)
    # Assert: each neighbour weighs e^sqrt(3/2) (at T = 1 sd) or e^(sqrt(3/2) / 2) (2 sd) more
    r1, r2 = np.exp(np.sqrt(1.5)), np.exp(np.sqrt(1.5) / 2)
    np.testing.assert_allclose(at_1, np.array([1.0, r1, r1**2]) / (1 + r1 + r1**2))
    np.testing.assert_allclose(at_2, np.array([1.0, r2, r2**2]) / (1 + r2 + r2**2))
    np.testing.assert_allclose(round_weights("softmax-spread", phi, [5, 5, 5], 2.0), at_2)
    # the fixed temperature 1 on the same phi is nearly uniform: neighbours e^0.1 apart
    fixed = round_weights("softmax", phi, [5, 5, 5], 1.0)
    assert fixed[2] / fixed[1] == pytest.approx(np.exp(0.1))
    assert at_1[2] / at_1[1] == pytest.approx(3.40, abs=0.01)


def test_spread_weights_ignore_phis_units_and_offset() -> None:
    phi = np.array([-0.02, 0.01, 0.05, 0.0])
    np.testing.assert_allclose(spread_weights(1000.0 * phi + 7.0), spread_weights(phi))


@pytest.mark.parametrize(("phi", "expected"), [([0.2, 0.2, 0.2], [1 / 3] * 3), ([0.7], [1.0])])
def test_spread_weights_without_spread_are_equal(phi: list[float], expected: list[float]
                                                 ) -> None:
    np.testing.assert_allclose(spread_weights(np.array(phi)), expected)


def test_spread_weights_refuse_bad_inputs() -> None:
    with pytest.raises(ValueError, match="finite"):
        spread_weights(np.array([np.nan, 0.1]))
    with pytest.raises(ValueError, match=r"temperature=0.0 \(the multiple of phi's spread\)"):
        spread_weights(np.array([0.1, 0.2]), 0.0)
    # the aggregation needs phi: refused for a valuation that computes none
    (problem,) = aggregation_problems("none", "softmax-spread")
    assert "aggregation='softmax-spread' weights by phi" in problem
