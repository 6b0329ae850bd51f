"""HiCS-FL (issue 62, deliver 2): its estimates, clusters and annealed draws on the spec's
hand-built bias updates (/tmp/peers-spec.md section 3f), the output-layer finder, the selector's
warm-up, stale estimates and state, and short runs through FedOwen with equal weights (its
published setting) and with FedOwen's valuation."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from scipy.special import softmax

from fedowen_strategy.defences.guards import Guards
from fedowen_strategy.replies import record_to_state, state_to_record
from fedowen_strategy.round.contribution import ValuationSettings
from fedowen_strategy.selectors.base import Pool, Seen
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
from fedowen_strategy.strategy import FedOwen
from fedowen_task.models import build_model, state_to_numpy
from fedowen_task.protocol import STEP_SCALE_FIELD
from server_app.config import RunConfig
from server_app.store.records import RunRecorder, read_rounds
from sim.inline_grid import InProcessGrid
from tests.test_strategy import BARE

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


def test_settings_problems() -> None:
    with pytest.raises(ValueError, match=r"hics_temperature=0\.0 must be a finite number > 0"):
        HicsSettings(hics_temperature=0.0)
    with pytest.raises(ValueError, match="hics_rounds=0 must be >= 1"):
        HicsSettings(hics_rounds=0)
    bad = HicsSettings.problems_of({"hics_clusters": -1, "hics_lambda": -1.0},
                                   {"hics_clusters": "hics-clusters"})
    assert bad == ["hics_lambda=-1.0 must be a finite number >= 0",
                   "hics-clusters=-1 must be >= 0 (0 = clients-per-round)"]


def reply(bias: Sequence[float], scale: float | None = None, name: str = "fc.bias"
          ) -> RecordDict:
    """A train reply as a client sends it: its arrays and, when given, its step scale."""
    metrics = MetricRecord({"num-examples": 20} if scale is None
                           else {"num-examples": 20, STEP_SCALE_FIELD: scale})
    return RecordDict({"arrays": state_to_record({"fc.weight": np.zeros((4, 2), np.float32),
                                                  name: np.asarray(bias, np.float32)}),
                       "metrics": metrics})


def seen(server_round: int, updates: Mapping[str, Sequence[float]], scale: float = 2.0
         ) -> Seen:
    """What a round shows the selector: each client's update of a zero bias, sent with
    ``scale`` (the states as averaged are left zero: the selector reads the replies)."""
    zero = {"fc.weight": np.zeros((4, 2), np.float32), "fc.bias": np.zeros(4, np.float32)}
    return Seen(server_round, tuple(updates), None,
                tuple(reply(np.asarray(u) * scale, scale) for u in updates.values()),
                tuple(zero for _ in updates), zero)


def test_warm_up_first_then_clusters_and_a_late_joiner_first() -> None:
    # Prepare: N = 7, k = 3 (the spec's: the code's floor(7/3) rounds never probe client 6)
    hics, rng = Hics(HicsSettings(hics_temperature=0.01, hics_rounds=10)), np.random.default_rng(0)
    keys = tuple(f"c{i}" for i in range(7))
    updates = {f"c{i}": (A if i < 2 else B if i < 4 else C if i % 2 else D) for i in range(7)}
    # Execute: three rounds, each observed
    records = []
    for t in (1, 2, 3):
        choice = hics.choose(Pool(keys, 3, t), rng, never)
        records.append(choice.record)
        hics.observe(seen(t, {keys[i]: updates[keys[i]] for i in choice.indices}))
    late = hics.choose(Pool((*keys, "c7"), 3, 4), rng, never)
    # Assert: 3 + 3 new clients, then the last one and 2 drawn from the clusters; the newcomer
    # first in round 4
    assert [r["warmup"] for r in records] == [3, 3, 1]
    assert "clusters" not in records[1] and records[2]["clusters"] == 3
    assert set(hics.updates) == set(keys) and hics.tried == {*keys, "c7"}
    assert 7 in late.indices.tolist() and late.record["warmup"] == 1
    assert all(r["extra_messages"] == 0 and r["server_seconds"] >= 0 for r in records)


def test_estimates_are_the_sent_bias_update_per_unit_step() -> None:
    # Prepare
    hics = Hics(HicsSettings())
    zero = {"fc.weight": np.zeros((4, 2)), "fc.bias": np.zeros(4)}
    capped = {"fc.weight": np.zeros((4, 2)), "fc.bias": np.full(4, 0.5)}
    # Execute: c0 reports scale 4; c1 no scale (used unscaled); the states differ (capped)
    hics.observe(Seen(1, ("c0", "c1"), None, (reply([4, 0, 0, -4], 4.0), reply([1, 0, 0, 0])),
                      (capped, capped), zero))
    # Assert: from the replies' arrays as sent, divided by the scale
    assert hics.updates == {"c0": [1.0, 0.0, 0.0, -1.0], "c1": [1.0, 0.0, 0.0, 0.0]}
    assert hics.bias_key == "fc.bias"


def test_a_model_without_an_output_bias_fails_in_the_first_observe() -> None:
    hics = Hics(HicsSettings())
    with pytest.raises(ValueError, match=r"selection='hics-fl' estimates .* has none"):
        hics.observe(Seen(1, (), None, (), (), {"w": np.zeros(4)}))


def test_absent_clients_keep_their_stale_estimates() -> None:
    # Prepare: four clients estimated in round 1
    hics, rng = Hics(HicsSettings(hics_temperature=0.01)), np.random.default_rng(2)
    keys = ("c0", "c1", "c2", "c3")
    hics.tried = set(keys)
    hics.observe(seen(1, dict(zip(keys, SPEC.tolist(), strict=True))))
    # Execute: c2 and c3 (the balanced ones) are not available in round 2
    choice = hics.choose(Pool(("c0", "c1"), 2, 2), rng, never)
    # Assert: the two available are drawn; the absent keep their estimates and clusters
    assert choice.indices.tolist() == [0, 1] and choice.how == "hics-fl"
    assert set(hics.updates) == set(keys) and choice.record["clusters"] == 2
    assert choice.record["cluster_entropy"] == [0.2618]


def test_state_round_trips_through_json() -> None:
    # Prepare
    first, rng = Hics(HicsSettings(hics_temperature=0.01)), np.random.default_rng(3)
    keys = ("c0", "c1", "c2", "c3", "c4")
    first.choose(Pool(keys, 4, 1), rng, never)
    first.observe(seen(1, dict(zip(sorted(first.tried), SPEC.tolist(), strict=True))))
    # Execute
    again = Hics(HicsSettings(hics_temperature=0.01))
    again.load(json.loads(json.dumps(first.state())))
    state = rng.bit_generator.state
    a = first.choose(Pool(keys, 3, 2), rng, never)
    rng.bit_generator.state = state
    b = again.choose(Pool(keys, 3, 2), rng, never)
    # Assert
    assert again.state() == json.loads(json.dumps(first.state()))
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.record is not None and b.record is not None
    assert {k: v for k, v in a.record.items() if k != "server_seconds"} == {
        k: v for k, v in b.record.items() if k != "server_seconds"}


#: The toy federation: client i's label distribution over C = 4 classes (one label for 0-3,
#: balanced for 4-5); local training is 10 steps of gradient descent on the output bias.
LABELS = [np.eye(4)[i] for i in range(4)] + [np.full(4, 0.25)] * 2
LR, STEPS = 0.5, 10


def toy_handler(msg: Message, ctx: Context) -> Message:
    pid = int(ctx.node_config["partition-id"])
    named = ConfigRecord({"client-id": f"c{pid}"})
    if msg.metadata.message_type == "query":
        return Message(RecordDict({"client": named}), reply_to=msg)
    state = record_to_state(msg.content["arrays"])
    bias = state["fc.bias"].astype(np.float64)
    for _ in range(STEPS):  # the cross-entropy's gradient on the bias: softmax(b) - labels
        bias += LR * (LABELS[pid] - softmax(bias))
    asked = bool(msg.content["config"].get(STEP_SCALE_FIELD, 0))
    metrics = {"num-examples": 20, **({STEP_SCALE_FIELD: LR * STEPS} if asked else {})}
    new = {"fc.weight": state["fc.weight"], "fc.bias": bias.astype(np.float32)}
    return Message(RecordDict({"arrays": state_to_record(new), "metrics": MetricRecord(metrics),
                               "client": named}), reply_to=msg)


def toy_utility(global_state: Mapping[str, np.ndarray], states: Sequence[Mapping[str, Any]],
                examples: Sequence[int]) -> Any:
    """Minus the cross-entropy of the averaged bias on balanced labels."""
    biases = np.stack([s["fc.bias"] for s in states]).astype(np.float64)

    def utility(masks: np.ndarray) -> np.ndarray:
        out = np.empty(len(masks))
        for r, m in enumerate(masks):
            b = global_state["fc.bias"] if not m.any() else biases[m].mean(axis=0)
            out[r] = float(np.mean(np.log(softmax(b))))
        return out

    return utility


@pytest.mark.parametrize(("valuation", "aggregation"), [("none", "uniform"), ("owen", "softmax")])
def test_six_rounds_through_fedowen(valuation: str, aggregation: str, tmp_path: Any) -> None:
    # Prepare: 6 clients, 2 a round: 3 warm-up rounds, then 3 drawn from M = 2 clusters
    recorder = RunRecorder(tmp_path)
    strategy = FedOwen(
        clients_per_round=2, utility_factory=toy_utility,
        valuation=ValuationSettings(method=valuation, budget_m=4, aggregation=aggregation,
                                    game="average"),
        guards=Guards(**BARE), selection=HicsSettings(hics_rounds=6),
        on_round=recorder.log_train, seed=3)
    init = {"fc.weight": np.zeros((4, 2), np.float32), "fc.bias": np.zeros(4, np.float32)}

    def evaluate(server_round: int, arrays: Any) -> MetricRecord:
        recorder.log_eval(server_round, {})
        return MetricRecord({})

    # Execute
    strategy.start(grid=InProcessGrid(toy_handler, [{"partition-id": i} for i in range(6)]),
                   initial_arrays=state_to_record(init), num_rounds=6, evaluate_fn=evaluate)
    # Assert: every client once in the warm-up, then the balanced clients' cluster first
    rounds = read_rounds(tmp_path)[1:]
    warm = [c for r in rounds[:3] for c in r["selected"]]
    assert sorted(warm) == [f"c{i}" for i in range(6)]
    assert [r["selection"]["how"] for r in rounds] == ["warm-up"] * 3 + ["hics-fl"] * 3
    assert [r["selection"]["gamma"] for r in rounds[3:]] == pytest.approx([2.0, 4 / 3, 2 / 3])
    assert all(r["selection"]["clusters"] == 2 for r in rounds[3:])
    assert rounds[3]["selected"] == ["c4", "c5"]
    estimates = strategy.chooser.state()["state"]["updates"]
    entropy = skew_entropy(np.array([estimates[f"c{i}"] for i in range(6)]),
                           HicsSettings().hics_temperature)
    assert entropy[:4].max() < entropy[4:].min()  # one label vs balanced
    weights = [sorted(r["weights"].values()) for r in rounds]
    if aggregation == "uniform":  # the published setting: equal weights
        assert all(w == [0.5, 0.5] for w in weights)
    else:  # FedOwen's: softmax of phi
        assert any(w != [0.5, 0.5] for w in weights)
