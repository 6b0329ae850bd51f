"""HiCS-FL's selector (issue 62, deliver 2): warm-up, late joiners, the estimates it reads
off the replies as sent, stale estimates, its state, and 6 rounds through FedOwen with equal
weights (its published setting) and with FedOwen's valuation (tests/test_hics.py: its
formulas)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from scipy.special import softmax

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.replies import record_to_state, state_to_record
from fedowen_strategy.round.contribution import ValuationSettings
from fedowen_strategy.selectors.base import Pool, Seen, SelectorSettings
from fedowen_strategy.selectors.hics import Hics, HicsSettings
from fedowen_strategy.selectors.hics_estimates import skew_entropy
from fedowen_strategy.strategy import FedOwen
from fedowen_task.protocol import STEP_SCALE_FIELD
from server_app.store.records import RunRecorder, read_rounds
from sim.inline_grid import InProcessGrid
from tests.test_hics import SPEC, A, B, C, D, never
from tests.test_strategy import BARE


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


def test_estimates_are_the_sent_bias_update_per_unit_step() -> None:
    # Prepare
    hics = Hics(HicsSettings(hics_rounds=100))
    zero = {"fc.weight": np.zeros((4, 2)), "fc.bias": np.zeros(4)}
    capped = {"fc.weight": np.zeros((4, 2)), "fc.bias": np.full(4, 0.5)}
    # Execute: c0 reports scale 4; c1 no scale (used unscaled); the states differ (capped)
    hics.observe(Seen(1, ("c0", "c1"), None, (reply([4, 0, 0, -4], 4.0), reply([1, 0, 0, 0])),
                      (capped, capped), zero))
    # Assert: from the replies' arrays as sent, divided by the scale
    assert hics.updates == {"c0": [1.0, 0.0, 0.0, -1.0], "c1": [1.0, 0.0, 0.0, 0.0]}
    assert hics.bias_key == "fc.bias"


def test_a_model_without_an_output_bias_fails_in_the_first_observe() -> None:
    hics = Hics(HicsSettings(hics_rounds=100))
    with pytest.raises(ValueError, match=r"selection='hics-fl' estimates .* has none"):
        hics.observe(Seen(1, (), None, (), (), {"w": np.zeros(4)}))


def test_absent_clients_keep_their_stale_estimates() -> None:
    # Prepare: four clients estimated in round 1
    hics, rng = Hics(HicsSettings(hics_temperature=0.01, hics_rounds=100)), np.random.default_rng(2)
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
    first = Hics(HicsSettings(hics_temperature=0.01, hics_rounds=100))
    rng = np.random.default_rng(3)
    keys = ("c0", "c1", "c2", "c3", "c4")
    first.choose(Pool(keys, 4, 1), rng, never)
    first.observe(seen(1, dict(zip(sorted(first.tried), SPEC.tolist(), strict=True))))
    # Execute
    again = Hics(HicsSettings(hics_temperature=0.01, hics_rounds=100))
    again.load(json.loads(json.dumps(first.state())))
    state = rng.bit_generator.state
    a = first.choose(Pool(keys, 3, 2), rng, never)
    rng.bit_generator.state = state
    b = again.choose(Pool(keys, 3, 2), rng, never)
    # Assert
    assert again.state() == json.loads(json.dumps(first.state()))
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.record is not None and b.record is not None
    assert a.record == b.record


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
    # Prepare / Execute: 6 clients, 2 a round: 3 warm-up rounds, then 3 drawn from M = 2
    # clusters
    strategy = run_hics_toy(HicsSettings(hics_rounds=6), 6, tmp_path,
                            ValuationSettings(method=valuation, budget_m=4,
                                              aggregation=aggregation, game="average"))
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


def run_hics_toy(selection: SelectorSettings, rounds: int, tmp_path: Any,
                 valuation: ValuationSettings) -> FedOwen:
    """``rounds`` rounds of FedOwen with ``selection`` on the toy (clients 0-3 one label each,
    4-5 balanced), 2 a round, seed 3, recorded in ``tmp_path``."""
    recorder = RunRecorder(tmp_path)
    strategy = FedOwen(clients_per_round=2, utility_factory=toy_utility, valuation=valuation,
                       guards=Guards(**BARE), selection=selection,
                       on_round=recorder.log_train, seed=3)
    init = {"fc.weight": np.zeros((4, 2), np.float32), "fc.bias": np.zeros(4, np.float32)}

    def evaluate(server_round: int, arrays: Any) -> MetricRecord:
        recorder.log_eval(server_round, {})
        return MetricRecord({})

    strategy.start(grid=InProcessGrid(toy_handler, [{"partition-id": i} for i in range(6)]),
                   initial_arrays=state_to_record(init), num_rounds=rounds, evaluate_fn=evaluate)
    return strategy


def test_fedowen_start_resolves_hics_rounds_to_the_runs_length(tmp_path: Any) -> None:
    # a strategy built by hand with hics-rounds left at 0 (the run's length) anneals over the
    # rounds its start runs
    strategy = run_hics_toy(HicsSettings(), 4, tmp_path,
                            ValuationSettings(method="none", aggregation="uniform"))
    assert strategy.chooser.settings == HicsSettings(hics_rounds=4)
    rounds = read_rounds(tmp_path)[1:]
    assert [r["selection"]["gamma"] for r in rounds] == pytest.approx([4.0, 3.0, 2.0, 1.0])
