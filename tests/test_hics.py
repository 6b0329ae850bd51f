"""HiCS-FL (issue 62, deliver 2): its estimates, clusters and annealed draws on the spec's
hand-built bias updates (issue 62's peer spec, section 3f), the output-layer finder and the
check before the first round (tests/test_hics_selector.py: the selector through FedOwen)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy.special import softmax

from client_app.app import app as client_app
from fedowen_strategy.selectors.base import Pool
from fedowen_strategy.selectors.hics import Hics, HicsSettings
from fedowen_strategy.selectors.hics_estimates import (
    annealed_gamma,
    cluster_probabilities,
    draw_cluster_counts,
    hics_distances,
    hics_pick,
    output_bias_key,
    skew_entropy,
    ward_clusters,
)
from fedowen_task.models import build_model, state_to_numpy
from server_app.app import run
from server_app.config import RunConfig, parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid

#: The spec's updates (C = 4): one label (class 0, class 1), near uniform, its negative.
A = [0.03, -0.01, -0.01, -0.01]
B = [-0.01, 0.03, -0.01, -0.01]
C = [0.001, -0.001, 0.001, -0.001]
D = [-0.001, 0.001, -0.001, 0.001]
SPEC = np.array([A, B, C, D])


def never(*_: Any, **__: Any) -> Any:
    raise AssertionError("HiCS-FL asks no client before it chooses")


def test_entropy_distances_and_clusters_of_the_specs_updates() -> None:
    # Execute
    h = skew_entropy(SPEC, 0.01)
    d = hics_distances(SPEC, h, 10.0)
    labels = ward_clusters(d, 2)
    # Assert: softmax(A / T) = (0.94791, 0.01736 x 3) -> 0.2618; C's -> 1.3813; 0 -> ln 4
    np.testing.assert_allclose(softmax(SPEC[0] / 0.01), [0.94791, 0.01736, 0.01736, 0.01736],
                               atol=1e-5)
    np.testing.assert_allclose(h, [0.2618, 0.2618, 1.3813, 1.3813], atol=1e-4)
    assert skew_entropy(np.zeros((1, 4)), 0.01)[0] == pytest.approx(math.log(4))
    assert h.var() == pytest.approx(0.3133, abs=1e-4)  # the code would fall back; not here
    # arccos(-1/3) = 1.9106; arccos(1/sqrt 3) + 10 x 1.1195 = 12.1502; pi between C and D
    np.testing.assert_allclose(d, [[0, 1.9106, 12.1502, 13.3812],
                                   [1.9106, 0, 13.3812, 12.1502],
                                   [12.1502, 13.3812, 0, 3.1416],
                                   [13.3812, 12.1502, 3.1416, 0]], atol=1e-4)
    # the one-label clients land apart from the uniform ones
    assert labels[0] == labels[1] != labels[2] == labels[3]


def test_a_zero_update_is_at_angle_zero_to_every_other() -> None:
    # Prepare: the code's zero update of a client selected but never estimated
    g = np.array([A, [0.0] * 4])
    # Execute
    d = hics_distances(g, np.array([0.2618, math.log(4)]), 10.0)
    # Assert: only the entropy gap remains
    assert d[0, 1] == d[1, 0] == pytest.approx(10.0 * (math.log(4) - 0.2618))


def test_ward_gives_each_client_its_cluster_when_there_are_few() -> None:
    np.testing.assert_array_equal(ward_clusters(np.zeros((3, 3)), 5), [0, 1, 2])


@pytest.mark.parametrize(("server_round", "gamma", "probs"), [
    (6, 3.96, (0.0117, 0.9883)),     # the spec's t = 5 (0-based)
    (251, 2.0, (0.0963, 0.9037)),
    (500, 0.008, (0.4978, 0.5022)),
])
def test_the_annealed_cluster_probabilities(server_round: int, gamma: float,
                                            probs: tuple[float, float]) -> None:
    # Execute
    g = annealed_gamma(4.0, server_round, 500)
    p = cluster_probabilities(np.array([0.2618, 1.3813]), g)
    # Assert
    assert g == pytest.approx(gamma)
    np.testing.assert_allclose(p, probs, atol=1e-4)


def test_gamma_never_goes_below_zero_past_its_rounds() -> None:
    assert annealed_gamma(4.0, 1, 10) == 4.0 and annealed_gamma(4.0, 30, 10) == 0.0


def test_capped_cluster_draws() -> None:
    # Prepare: K = 3 from two clusters of 2, pi = (0.3, 0.7)
    rng = np.random.default_rng(0)
    probs, capacity = np.array([0.3, 0.7]), np.array([2, 2])
    # Execute
    counts = np.array([draw_cluster_counts(probs, capacity, 3, rng) for _ in range(20000)])
    # Assert: always a {2, 1} split; cluster 0 gets 2 with pi_0^2 (1 + 2 pi_1) = 0.216
    assert set(map(tuple, counts.tolist())) == {(2, 1), (1, 2)}
    assert (counts[:, 0] == 2).mean() == pytest.approx(0.09 * 2.4, abs=0.01)
    with pytest.raises(ValueError, match="cannot draw 5 clients from clusters of 4"):
        draw_cluster_counts(probs, capacity, 5, rng)


def test_hics_pick_prefers_the_balanced_cluster_and_keeps_to_the_available() -> None:
    # Prepare
    rng = np.random.default_rng(1)
    everyone = np.ones(4, dtype=bool)
    # Execute: 2 of 4 at gamma 3.96 (the balanced cluster drawn with 0.9883)
    picks = [tuple(hics_pick(SPEC, everyone, 2, 2, 3.96, 0.01, 10.0, rng)[0].tolist())
             for _ in range(400)]
    only_skewed, info = hics_pick(SPEC, np.array([True, True, False, False]), 2, 2, 3.96,
                                  0.01, 10.0, rng)
    # Assert: {C, D} unless the skewed cluster is drawn (1 - 0.9883^2 ~ 2.3% of rounds)
    assert np.mean([p == (2, 3) for p in picks]) == pytest.approx(0.9883 ** 2, abs=0.03)
    np.testing.assert_array_equal(only_skewed, [0, 1])
    assert info == {"clusters": 2, "cluster_p": [1.0], "cluster_entropy": [0.2618],
                    "entropy": [0.2618, 0.8216, 1.3813]}


class NoBias(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 10, bias=False)


@pytest.mark.parametrize(("model", "channels", "expected"), [
    ("lenet", 1, "fc3.bias"), ("resnet18", 3, "fc.bias"), ("cnn", 3, "fc3.bias")])
def test_the_output_layer_finder(model: str, channels: int, expected: str) -> None:
    # Prepare: ResNet-18's BatchNorm biases (1-D weight) and counters come before fc.bias
    state = state_to_numpy(build_model(model, channels, 10))
    # Execute / Assert
    assert output_bias_key(state) == expected
    assert HicsSettings().model_problems(state, 10) == []


def test_a_model_without_an_output_bias_fails_at_start_naming_selection() -> None:
    # Prepare
    state = state_to_numpy(NoBias())
    cfg = RunConfig(selection="hics-fl", valuation="none", aggregation="uniform")
    # Execute
    problems = cfg.model_problems(state, 10)
    # Assert: the last linear bias is the body's (8 entries), not one per class
    assert output_bias_key(state) == "body.bias"
    assert len(problems) == 1 and problems[0].startswith("selection='hics-fl' reads the last")
    assert "choose another selection" in problems[0]
    assert output_bias_key({"w": np.zeros((10, 4)), "bn.weight": np.ones(3),
                            "bn.bias": np.zeros(3)}) is None
    assert "has none" in HicsSettings().model_problems({"w": np.zeros(4)}, 4)[0]
    assert RunConfig(selection="oort").model_problems({"w": np.zeros(4)}, 4) == []


def flat_without_bias(in_channels: int, num_classes: int) -> torch.nn.Module:
    """A 28x28 classifier whose output layer has no bias (``model =
    "tests.test_hics:flat_without_bias"``)."""
    return torch.nn.Sequential(torch.nn.Flatten(),
                               torch.nn.Linear(in_channels * 28 * 28, num_classes, bias=False))


def test_the_server_app_stops_before_the_first_round(shared_data_dir: Path,
                                                     tmp_path: Path) -> None:
    # Prepare
    run_config = {"dataset": "mnist", "data-dir": str(shared_data_dir),
                  "output-dir": str(tmp_path), "num-server-rounds": 1, "clients-per-round": 2,
                  "client-max-samples": 50, "test-max-samples": 50, "selection": "hics-fl",
                  "model": "tests.test_hics:flat_without_bias"}
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": 2}
                                      for i in range(2)], run_config)
    # Execute / Assert: refused by name before any message is sent or round recorded
    with pytest.raises(ValueError, match="selection='hics-fl' estimates each client's label"):
        run(grid, parse_run_config(run_config), tmp_path)
    assert grid.sent == [] and read_rounds(tmp_path) == []


def test_settings_problems() -> None:
    with pytest.raises(ValueError, match=r"hics_temperature=0\.0 must be a finite number > 0"):
        HicsSettings(hics_temperature=0.0)
    with pytest.raises(ValueError, match=r"hics_rounds=-1 must be >= 0 \(0 = num-server-rounds\)"):
        HicsSettings(hics_rounds=-1)
    bad = HicsSettings.problems_of({"hics_clusters": -1, "hics_lambda": -1.0},
                                   {"hics_clusters": "hics-clusters"})
    assert bad == ["hics_lambda=-1.0 must be a finite number >= 0",
                   "hics-clusters=-1 must be >= 0 (0 = clients-per-round)"]


@pytest.mark.parametrize("selection", ["hics-fl", "hics-phi"])
def test_hics_rounds_default_to_the_runs_rounds(selection: str) -> None:
    # the app anneals over num-server-rounds unless hics-rounds is set
    def resolved(extra: dict[str, Any]) -> int:
        cfg = parse_run_config({"selection": selection, "num-server-rounds": 30, **extra})
        return cfg.selector_settings().hics_rounds  # type: ignore[attr-defined, no-any-return]
    assert resolved({}) == 30
    assert resolved({"hics-rounds": 12}) == 12
    # a selector driven by hand must resolve it before it draws (FedOwen.start does): the
    # error says how
    with pytest.raises(ValueError, match=r"hics_rounds=0: 0 stands for the run's num-server"):
        Hics(HicsSettings()).choose(Pool(("a", "b"), 1, 1), np.random.default_rng(0), never)
    assert Hics(HicsSettings().for_run(7)).settings.hics_rounds == 7
