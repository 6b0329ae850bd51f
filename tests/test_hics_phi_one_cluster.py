"""hics-phi on a model without a usable output-layer bias (none, or the last linear bias is not
the output layer's): all clients one cluster, its slots drawn by Algorithm 2's probabilities on
phi (not uniformly), the warm-up kept, one warning, and the round records say so. hics-fl
still refuses such a model (tests/test_hics.py); with a bias nothing changes
(tests/test_hics_phi.py, tests/test_selections_pinned.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from client_app.app import app as client_app
from fedowen_strategy.replies import state_to_record
from fedowen_strategy.selectors.base import Pool, Seen
from fedowen_strategy.selectors.hics_estimates import output_bias_problem
from fedowen_strategy.selectors.hics_phi import HicsPhi, HicsPhiSettings, bandit_probabilities
from fedowen_task.models import build_model, state_to_numpy
from server_app.app import run
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid
from tests.test_hics import NoBias, never

KEYS = tuple(f"c{i}" for i in range(6))
PHI = {"c0": 0.0, "c1": 0.0, "c2": 0.4, "c3": 0.3, "c4": 0.2, "c5": 0.1}
#: A linear model with no bias at all.
NO_BIAS = {"fc.weight": np.zeros((4, 2), np.float32)}
#: The last linear bias is a hidden layer's (8 entries), the output layer has none.
WRONG_SIZE = state_to_numpy(NoBias())
LOGGER = "fedowen_strategy.selectors.hics_phi"


def observed(server_round: int, clients: Mapping[str, float], state: Mapping[str, Any]
             ) -> Seen:
    """A valued round: each client's reply (the model's arrays, its step scale) and phi."""
    reply = RecordDict({"arrays": state_to_record(dict(state)),
                        "metrics": MetricRecord({"num-examples": 20, "step-scale": 2.0})})
    return Seen(server_round, tuple(clients), np.array(list(clients.values())),
                tuple(reply for _ in clients), tuple(state for _ in clients), state)


def valued(state: Mapping[str, Any], epsilon: float = 0.0) -> HicsPhi:
    """hics-phi that has seen ``state`` and every client of :data:`KEYS` valued once."""
    selector = HicsPhi(HicsPhiSettings(epsilon=epsilon, hics_rounds=100))
    selector.observe(observed(1, PHI, state))
    return selector


def test_built_in_models_have_their_output_bias_and_odd_ones_are_named() -> None:
    # Prepare / Execute / Assert: nothing changes for the built-in models
    for model, channels in (("lenet", 1), ("cnn", 3), ("resnet18", 3)):
        assert output_bias_problem(state_to_numpy(build_model(model, channels, 10))) == ""
    assert output_bias_problem(NO_BIAS) == (
        "it has no '<layer>.bias' beside a '<layer>.weight' matrix")
    assert output_bias_problem(WRONG_SIZE) == (
        "its last linear layer's bias 'body.bias' (8 entries) is not the output layer's: "
        "'head.weight' follows it")


@pytest.mark.parametrize("state", [NO_BIAS, WRONG_SIZE], ids=["no-bias", "wrong-size"])
def test_one_cluster_drawn_by_algorithm_2s_probabilities(
        state: Mapping[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: every client tried and valued once; no exploration
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        selector = valued(state)
        selector.observe(observed(2, {"c2": 0.4}, state))  # a second round: no second warning
    expected = bandit_probabilities(selector.bandit, Pool(KEYS, 2, 200), selector.settings)
    rng, rounds, counts = np.random.default_rng(0), 3000, np.zeros(len(KEYS))
    # Execute: round 200 each time (Algorithm 2's bonus depends on the round)
    for _ in range(rounds):
        choice = selector.choose(Pool(KEYS, 2, 200), rng, never)
        counts[choice.indices] += 1
    # Assert: one warning naming the model's lack and the fix; no estimate read
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1
    assert warnings[0].startswith("selection='hics-phi' clusters clients by their update")
    assert output_bias_problem(state) in warnings[0] and "nn.Linear(d, num_classes, bias=True)" \
        in warnings[0]
    assert selector.estimates.updates == {}
    # the record: one cluster, no output bias, Algorithm 2 exploiting
    assert choice.how == "hics-phi" and choice.record == {
        "warmup": 0, "gamma": 0.0, "output_bias": False, "clusters": 1, "slots": [2],
        "explored": 0}
    # phi steers it: the lowest-phi clients (probability 0 once shifted) never, the rest as
    # often as two successive draws with Algorithm 2's probabilities over the pool include
    # them: p_i + sum_j p_j p_i / (1 - p_j), here (0, 0, 0.64, 0.56, 0.46, 0.34) against 1/3 each
    # uniformly
    p = expected
    inclusion = p + np.array([sum(p[j] * p[i] / (1 - p[j]) for j in range(len(p)) if j != i)
                              for i in range(len(p))])
    se = np.sqrt(inclusion * (1 - inclusion) / rounds)
    assert counts[:2].sum() == 0 and inclusion[:2].sum() == 0
    assert np.all(np.abs(counts / rounds - inclusion) <= 4 * se + 1e-12)
    assert inclusion[2] - inclusion[5] > 0.2


def test_exploration_draws_the_cluster_uniformly() -> None:
    choice = valued(NO_BIAS, epsilon=1.0).choose(Pool(KEYS, 2, 5), np.random.default_rng(2),
                                                 never)
    assert choice.record is not None and choice.record["explored"] == 1


def test_warm_up_first_then_one_cluster_and_the_state_round_trips() -> None:
    # Prepare: N = 7, k = 3, the model has no output bias
    selector = HicsPhi(HicsPhiSettings(hics_rounds=10))
    keys, rng = tuple(f"c{i}" for i in range(7)), np.random.default_rng(0)
    # Execute: three rounds, each observed (phi: the client's number / 10)
    records = []
    for t in (1, 2, 3):
        choice = selector.choose(Pool(keys, 3, t), rng, never)
        records.append((choice.how, choice.record))
        selector.observe(observed(t, {keys[i]: i / 10 for i in choice.indices}, NO_BIAS))
    again = HicsPhi(HicsPhiSettings(hics_rounds=10))
    again.load(json.loads(json.dumps(selector.state())))
    state = rng.bit_generator.state
    a = selector.choose(Pool(keys, 3, 4), rng, never)
    rng.bit_generator.state = state
    b = again.choose(Pool(keys, 3, 4), rng, never)
    # Assert: 3 + 3 never-selected clients, then the last one and 2 from the one cluster; the
    # model is known from round 2 on
    assert [(how, r["warmup"]) for how, r in records] == [("warm-up", 3), ("warm-up", 3),
                                                         ("hics-phi", 1)]
    assert "output_bias" not in records[0][1] and records[1][1]["output_bias"] is False
    assert records[2][1]["clusters"] == 1 and records[2][1]["slots"] == [2]
    assert selector.state()["output_bias"] is False
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.record == b.record and a.record is not None and a.record["clusters"] == 1


def test_the_app_runs_a_model_without_an_output_bias(shared_data_dir: Path, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: the app's defaults with hics-phi and a user's model whose output layer has no
    # bias; 3 clients, 2 a round
    run_config = {"dataset": "mnist", "data-dir": str(shared_data_dir),
                  "output-dir": str(tmp_path), "num-server-rounds": 3, "clients-per-round": 2,
                  "client-max-samples": 50, "test-max-samples": 50,
                  "model": "tests.test_hics:flat_without_bias", "selection": "hics-phi"}
    cfg = parse_run_config(run_config)
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": 3}
                                      for i in range(3)], run_config)
    # Execute
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(grid, cfg, tmp_path)
    # Assert: it ran every round, hics-phi as one cluster after the warm-up, and said why once
    assert cfg.choices().selection == "hics-phi"
    rounds = read_rounds(tmp_path)[1:]
    assert [r["selection"]["how"] for r in rounds] == ["warm-up", "hics-phi", "hics-phi"]
    assert [r["selection"].get("clusters") for r in rounds] == [None, 1, 1]
    assert [r["selection"].get("output_bias") for r in rounds] == [None, False, False]
    assert sum(r.name == LOGGER for r in caplog.records) == 1
