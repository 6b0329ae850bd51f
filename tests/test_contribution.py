"""One round's valuation on degenerate inputs: no division by zero, no NaN weights.

Documented behaviour (fedowen_strategy.round.contribution): phi is put on the ``l1`` scale by
default (divided by sum |phi|, so |phi| <= 1), or on the ``normalised`` scale (divided by
|nu(N) - nu(empty)|, an efficient estimator's values then sum to the sign of the gain); a
scale below FLAT keeps the raw values (all ~0) and the softmax weights are uniform.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from fedowen_strategy.round.contribution import ValuationSettings, value_round

GLOBAL = {"w": np.zeros(3, np.float32)}



def average_game(**settings: Any) -> ValuationSettings:
    """These tests' factories build the average game (the library's default is the delta)."""
    return ValuationSettings(game="average", **settings)

def factory_for(value: Callable[[np.ndarray], float]) -> Callable[..., Callable]:
    """A utility that scores the example-weighted average model with ``value``."""
    def factory(g: Mapping[str, np.ndarray], states: Sequence[Mapping[str, np.ndarray]],
                examples: Sequence[int]) -> Callable[[np.ndarray], np.ndarray]:
        ws = np.stack([s["w"] for s in states]).astype(np.float64)
        n = np.asarray(examples, dtype=np.float64)

        def utility(masks: np.ndarray) -> np.ndarray:
            return np.array([value(g["w"] if not m.any() else n[m] @ ws[m] / n[m].sum())
                             for m in masks])
        return utility
    return factory


def closeness(w: np.ndarray) -> float:
    return float(-np.linalg.norm(w - 1.0))


def states(*rows: list[float]) -> list[dict[str, np.ndarray]]:
    return [{"w": np.array(r, np.float32)} for r in rows]


@pytest.mark.parametrize("method", ["owen", "mc-shapley", "gtg-shapley", "banzhaf",
                                    "weighted-shap", "loo", "exact"])
def test_single_returned_client_gets_all_weight(method: str) -> None:
    val = value_round(states([1, 1, 1]), [5], GLOBAL, average_game(method=method),
                      factory_for(closeness), np.random.default_rng(0))
    assert val.weights.tolist() == [1.0]
    # the lone player's value is the whole gain: +1 on the l1 (default) and normalised scales
    assert val.phi[0] == pytest.approx(1.0)


def test_paper_algorithm_credits_a_lone_client_only_on_its_mask_levels() -> None:
    # Algorithm 1 literally: a walk credits the player only when Bernoulli(q) picked it, so
    # with Q = 2 (q = 1/2, 1) the expected credit is (1/2 + 1) / 2 = 3/4 of the gain: the
    # grid bias the README describes. Averaged over seeds it converges there, not to 1.
    vals = [value_round(states([1, 1, 1]), [5], GLOBAL,
                        average_game(method="owen-paper", budget_m=40,
                                          phi_scale="normalised"),
                        factory_for(closeness), np.random.default_rng(s)).phi[0]
            for s in range(40)]
    assert np.mean(vals) == pytest.approx(0.75, abs=0.05)


def test_identical_updates_aggregate_to_the_common_update() -> None:
    # Symmetric players: equal in expectation, not per draw; any convex combination of
    # identical models is that model, so the aggregate is exact whatever the draw.
    from fedowen_strategy.round.aggregation import weighted_average

    updates = states([1, 0, 1], [1, 0, 1], [1, 0, 1])
    val = value_round(updates, [4, 4, 4], GLOBAL, average_game(method="owen"),
                      factory_for(closeness), np.random.default_rng(1))
    assert np.all(np.isfinite(val.weights)) and val.weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(weighted_average(updates, val.weights)["w"], [1, 0, 1])
    exact = value_round(updates, [4, 4, 4], GLOBAL, average_game(method="exact"),
                        factory_for(closeness), np.random.default_rng(1))
    np.testing.assert_allclose(exact.phi, 1 / 3)


def test_flat_utility_gives_uniform_weights_without_nan() -> None:
    # nu(N) = nu(empty) = 0.5 for every coalition
    val = value_round(states([1, 2, 3], [0, 0, 0]), [3, 7], GLOBAL,
                      average_game(method="owen"), factory_for(lambda w: 0.5),
                      np.random.default_rng(2))
    assert val.nu_full == val.nu_empty == 0.5
    np.testing.assert_allclose(val.phi, 0.0, atol=1e-12)
    np.testing.assert_allclose(val.weights, 0.5)


def test_round_that_lowers_utility_sums_to_minus_one() -> None:
    # global w = 1 is perfect; both clients move away, one twice as far
    perfect = {"w": np.ones(3, np.float32)}
    val = value_round(states([0, 1, 1], [-1, 1, 1]), [1, 1], perfect,
                      average_game(method="exact", phi_scale="normalised"),
                      factory_for(closeness),
                      np.random.default_rng(3))
    assert val.nu_full < val.nu_empty
    assert val.phi.sum() == pytest.approx(-1.0)
    assert val.phi[0] > val.phi[1]  # the smaller damage is valued higher
    assert np.all(np.isfinite(val.weights)) and val.weights[0] > val.weights[1]


def test_raw_scale_keeps_utility_units() -> None:
    val = value_round(states([1, 1, 1], [0.5, 0.5, 0.5]), [1, 1], GLOBAL,
                      average_game(method="exact", phi_scale="raw"),
                      factory_for(closeness), np.random.default_rng(4))
    assert val.phi.sum() == pytest.approx(val.nu_full - val.nu_empty)


def test_fedavg_and_shapfed_need_no_utility() -> None:
    val = value_round(states([1, 1, 1], [0, 0, 2]), [1, 3], GLOBAL,
                      average_game(method="none"), None, np.random.default_rng(5))
    np.testing.assert_allclose(val.weights, [0.25, 0.75])
    with pytest.raises(ValueError, match="needs a utility"):
        value_round(states([1, 1, 1]), [1], GLOBAL, average_game(method="owen"), None,
                    np.random.default_rng(6))


def test_multikrum_drops_the_outliers_and_averages_the_rest() -> None:
    # Prepare: four close updates and one far outlier, f = 1 -> keep 4 of 5
    updates = states([1, 1, 1], [1.1, 1, 1], [1, 0.9, 1], [1, 1, 1.1], [50, -50, 50])
    # Execute
    val = value_round(updates, [1, 1, 1, 1, 1], GLOBAL,
                      average_game(method="multikrum", krum_malicious=1), None,
                      np.random.default_rng(0))
    # Assert
    assert val.phi.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    np.testing.assert_allclose(val.weights, [0.25, 0.25, 0.25, 0.25, 0.0])


def test_l1_scale_bounds_cancelling_contributions() -> None:
    # Contributions that nearly cancel: the gain is 0.003, each value is +-0.08
    from fedowen_strategy.round.round_valuers import scale_phi

    raw = np.array([0.0815, -0.0785, 0.0])
    normalised = scale_phi(raw, 0.003, "normalised")
    l1 = scale_phi(raw, 0.003, "l1")
    assert np.abs(normalised).max() == pytest.approx(27.17, abs=0.01)
    assert np.abs(l1).sum() == pytest.approx(1.0) and np.abs(l1).max() < 1
    # same-sign contributions: l1 and normalised agree
    same = np.array([0.02, 0.05, 0.03])
    np.testing.assert_allclose(scale_phi(same, 0.1, "l1"), scale_phi(same, 0.1, "normalised"))
    np.testing.assert_allclose(scale_phi(raw, 0.0, "normalised"), raw)  # flat round: raw kept
