"""The robust learning rate's sign vote and FLAME's aggregate noise
(fedowen_strategy.defences.robust_lr) on hand-built rounds, and their keys."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.defences.robust_lr import guard_aggregate, robust_lr_mask, sign_agreement
from fedowen_strategy.round.aggregation import weighted_average
from fedowen_task.config import ConfigError
from server_app.config import parse_run_config


def test_sign_agreement_and_mask_count_signs_per_coordinate() -> None:
    deltas = np.array([[1.0, -2.0, 0.0], [3.0, 1.0, 0.0], [0.5, -1.0, 0.0]])
    np.testing.assert_array_equal(sign_agreement(deltas), [3.0, 1.0, 0.0])
    np.testing.assert_array_equal(robust_lr_mask(deltas, 2), [1.0, -1.0, -1.0])


def test_a_direction_only_boosted_attackers_teach_is_reversed() -> None:
    # Prepare: 8 honest updates agree on coordinate 0 and split 4/4 on coordinate 1; two
    # attackers push coordinate 1 hard (x50), which dominates the plain average there
    glob = {"w": np.zeros(2, dtype=np.float32), "steps": np.array(7)}
    honest = [np.array([1.0, 1.0 if i % 2 else -1.0]) for i in range(8)]
    attackers = [np.array([1.0, 50.0]) for _ in range(2)]
    states = [{"w": d.astype(np.float32), "steps": np.array(7)} for d in honest + attackers]
    average = weighted_average(states, np.full(10, 0.1))
    assert average["w"][1] > 0
    # Execute: theta 4 (the attackers make 2 more agree on coordinate 1's sign, fewer than 4)
    state, record = guard_aggregate(average, states, glob, robust_lr_threshold=4,
                                    aggregate_noise=0.0, rng=np.random.default_rng(0))
    # Assert: coordinate 0's step kept, coordinate 1's reversed; counters untouched
    np.testing.assert_allclose(state["w"], [1.0, -average["w"][1]], rtol=1e-6)
    assert state["w"].dtype == np.float32 and int(state["steps"]) == 7
    assert record == {"robust_lr_reversed": 0.5}


def test_aggregate_noise_is_lambda_times_the_median_norm_and_seeded() -> None:
    glob = {"w": np.zeros(20000)}
    states = [{"w": np.full(20000, scale / np.sqrt(20000))} for scale in (1.0, 2.0, 30.0)]
    average = weighted_average(states, np.full(3, 1 / 3))

    def run(seed: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        return guard_aggregate(average, states, glob, robust_lr_threshold=0,
                               aggregate_noise=0.01, rng=np.random.default_rng(seed))

    noisy, record = run(0)
    assert record["aggregate_noise_std"] == pytest.approx(0.01 * 2.0)  # median norm 2
    assert np.std(noisy["w"] - average["w"]) == pytest.approx(0.02, rel=0.05)
    np.testing.assert_array_equal(noisy["w"], run(0)[0]["w"])
    assert not np.array_equal(noisy["w"], run(1)[0]["w"])


def test_both_off_return_the_average_unchanged() -> None:
    glob = {"w": np.zeros(3)}
    states = [{"w": np.array([1.0, -1.0, 2.0])}, {"w": np.array([3.0, 1.0, 0.0])}]
    average = weighted_average(states, np.array([0.5, 0.5]))
    state, record = guard_aggregate(average, states, glob, robust_lr_threshold=0,
                                    aggregate_noise=0.0, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(state["w"], average["w"])
    assert record == {}


@pytest.mark.parametrize(("key", "value"), [("robust-lr-threshold", -1),
                                            ("aggregate-noise", -0.1)])
def test_negative_settings_are_refused_by_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_run_config({key: value})
