"""FLTrust and FoolsGold: hand-computed weights, and the strategies over an in-process grid.

The toy federation (no torch, no Ray): the model is w in R^4, the target T. Honest clients
c0..c3 each move one coordinate of w halfway to T (distinct, non-IID directions); c4 moves w
away from T; c5 is a Sybil copy of c3 (the same update every round). The server's root-set
update moves all of w halfway to T.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedowen_strategy.peers.fltrust import FLTrust, fltrust_aggregate, trust_scores
from fedowen_strategy.peers.foolsgold import foolsgold_scores
from fedowen_strategy.replies import record_to_state, state_to_record
from server_app.config import parse_run_config
from server_app.store.records import RunRecorder, read_rounds
from server_app.strategies import build_flower_strategy
from sim.inline_grid import InProcessGrid

TARGET = np.array([1.0, -2.0, 0.5, 3.0])


def test_fltrust_by_hand() -> None:
    # Prepare: server update g0 = (1, 0); updates along it (x2), across it, at 45 deg, against
    g0 = np.array([1.0, 0.0])
    deltas = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0], [-1.0, 0.0]])
    # Execute
    delta, weights, trust = fltrust_aggregate(deltas, g0)
    # Assert: TS = ReLU(cos) = (1, 0, 1/sqrt2, 0); each update rescaled to ||g0|| = 1:
    # (1, 0) and (1, 1)/sqrt2; aggregate = (1*(1, 0) + (1/sqrt2)*(1/sqrt2)(1, 1)) / (1 + 1/sqrt2)
    #                                    = (1.5, 0.5) / 1.70711 = (0.87868, 0.29289)
    s = 1 / np.sqrt(2)
    np.testing.assert_allclose(trust, [1.0, 0.0, s, 0.0])
    np.testing.assert_allclose(weights, [1 / (1 + s), 0.0, s / (1 + s), 0.0])
    np.testing.assert_allclose(delta, [1.5 / (1 + s), 0.5 / (1 + s)])


def test_fltrust_gives_an_opposite_update_weight_zero_and_bounds_a_boosted_one() -> None:
    g0 = np.array([0.5, -0.5, 0.0])
    honest = np.array([0.4, -0.6, 0.1])
    # Execute: the honest update, its exact opposite, and the honest one boosted 100x
    _, weights, trust = fltrust_aggregate(np.stack([honest, -honest]), g0)
    boosted, w_boost, _ = fltrust_aggregate(np.stack([100 * honest]), g0)
    # Assert
    assert trust[1] == 0.0 and weights[1] == 0.0 and weights[0] == pytest.approx(1.0)
    assert boosted is not None and w_boost[0] == pytest.approx(1.0)
    assert np.linalg.norm(boosted) == pytest.approx(np.linalg.norm(g0))  # rescaled to ||g0||


def test_fltrust_trusts_nobody_when_every_update_points_away() -> None:
    delta, weights, _ = fltrust_aggregate(np.array([[-1.0, 0.0], [0.0, 0.0]]),
                                          np.array([1.0, 0.0]))
    assert delta is None and weights.tolist() == [0.0, 0.0]
    assert trust_scores(np.ones((2, 2)), np.zeros(2)).tolist() == [0.0, 0.0]  # g0 = 0


def test_foolsgold_by_hand() -> None:
    # Prepare: h1 = e1, h2 = e2, h3 = (0, 0.6, 0.8); cos(h2, h3) = 0.6, all others 0
    histories = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.6, 0.8]])
    # Execute
    scores = foolsgold_scores(histories, kappa=1.0)
    # Assert: v = (0, 0.6, 0.6); pardoning only scales row 1 (whose entries are 0);
    # a = 1 - max cs = (1, 0.4, 0.4); / max -> (1, 0.4, 0.4); 1 -> 0.99;
    # logit + 0.5: ln(99) + 0.5 = 5.1 -> clipped 1, ln(0.4 / 0.6) + 0.5 = 0.094535
    np.testing.assert_allclose(scores, [1.0, np.log(0.4 / 0.6) + 0.5, np.log(0.4 / 0.6) + 0.5])
    # kappa scales the logit: 2 x 0.094535
    np.testing.assert_allclose(foolsgold_scores(histories, kappa=2.0)[1:], 2 * 0.0945349,
                               rtol=1e-5)


def test_foolsgold_pardons_an_honest_client_that_resembles_a_sybil() -> None:
    # h1 = (1, 0); h2 = (3, 4)/5 and h3 = (0, 1): cos12 = 0.6, cos23 = 0.8, cos13 = 0.
    # v = (0.6, 0.8, 0.8): row 1's entry against 2 becomes 0.6 * 0.6 / 0.8 = 0.45, so
    # a = (0.55, 0.2, 0.2) -> (1, 0.364, 0.364) -> logit + 0.5 = (1, -0.06 -> 0, 0)
    scores = foolsgold_scores(np.array([[1.0, 0.0], [3.0, 4.0], [0.0, 1.0]]))
    np.testing.assert_allclose(scores, [1.0, 0.0, 0.0], atol=1e-12)


def test_foolsgold_drives_identical_histories_to_zero_and_keeps_distinct_honest() -> None:
    rng = np.random.default_rng(0)
    sybil = rng.normal(size=50)
    honest = rng.normal(size=(3, 50))
    # Execute: two exact copies, then two near copies (1% noise), beside three honest clients
    exact = foolsgold_scores(np.vstack([sybil, sybil, honest]))
    near = foolsgold_scores(np.vstack([sybil, sybil + 0.01 * rng.normal(size=50), honest]))
    # Assert
    assert exact[:2].tolist() == [0.0, 0.0] and near[:2].max() == 0.0
    assert exact[2:].min() > 0.9 and near[2:].min() > 0.9
    assert foolsgold_scores(np.vstack([sybil, sybil])).tolist() == [0.0, 0.0]
    assert foolsgold_scores(sybil[None, :]).tolist() == [1.0]  # a lone client is distinct


def toy_handler(msg: Message, ctx: Context) -> Message:
    pid = int(ctx.node_config["partition-id"])
    w = record_to_state(msg.content["arrays"])["w"].astype(np.float64)
    if pid == 4 or ctx.node_config.get("all-bad"):
        step = -(TARGET - w)
    else:
        axis = 3 if pid == 5 else pid  # c5 copies c3
        step = np.zeros(4)
        step[axis] = 0.5 * (TARGET[axis] - w[axis])
    return Message(RecordDict({"arrays": state_to_record({"w": (w + step).astype(np.float32)}),
                               "metrics": MetricRecord({"num-examples": 10, "train-loss": 1.0}),
                               "client": ConfigRecord({"client-id": f"c{pid}"})}),
                   reply_to=msg)


def run_peer(name: str, tmp_path: Any, rounds: int = 3, **node: Any) -> list[dict[str, Any]]:
    """``strategy = name`` from the run config, 6 toy clients per round, records in tmp_path."""
    cfg = parse_run_config({"strategy": name, "clients-per-round": 6})
    recorder = RunRecorder(tmp_path)

    def server_update(state: dict[str, np.ndarray], server_round: int) -> dict[str, np.ndarray]:
        return {"w": state["w"] + 0.5 * (TARGET - state["w"])}

    extra = {"server_update": server_update} if name == "fltrust" else {}
    strategy = build_flower_strategy(cfg, 6, recorder.log_train, **extra)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        dist = float(np.linalg.norm(record_to_state(arrays)["w"] - TARGET))
        recorder.log_eval(server_round, {"distance": dist})
        return MetricRecord({"distance": dist})

    strategy.start(grid=InProcessGrid(toy_handler, [{"partition-id": i, **node}
                                                    for i in range(6)]),
                   initial_arrays=state_to_record({"w": np.zeros(4, np.float32)}),
                   num_rounds=rounds, evaluate_fn=evaluate)
    return read_rounds(tmp_path)


def test_fltrust_strategy_records_weights_and_ignores_the_attacker(tmp_path: Any) -> None:
    rounds = run_peer("fltrust", tmp_path)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for rec in rounds[1:]:
        assert rec["strategy"] == "fltrust" and len(rec["returned"]) == 6
        assert sorted(rec["weights"]) == [f"c{i}" for i in range(6)]
        assert sum(rec["weights"].values()) == pytest.approx(1.0)
        assert rec["weights"]["c4"] == 0.0 and rec["trust"]["c4"] == 0.0
        assert min(rec["weights"][f"c{i}"] for i in range(4)) > 0
        assert rec["aggregation_seconds"] >= 0
    assert rounds[3]["distance"] < 0.6 * rounds[0]["distance"]


def test_fltrust_strategy_keeps_the_global_model_when_nobody_is_trusted(tmp_path: Any) -> None:
    rounds = run_peer("fltrust", tmp_path, rounds=2, **{"all-bad": 1})
    assert all("every trust score is 0" in r["kept_global"] for r in rounds[1:])
    assert rounds[2]["distance"] == pytest.approx(rounds[0]["distance"])


def test_fltrust_server_lr_scales_the_aggregate_and_a_diverged_server_update_keeps_the_model(
        ) -> None:
    # Prepare: the by-hand round above, through the strategy's combine
    reference = {"w": np.zeros(2)}
    deltas = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0], [-1.0, 0.0]])
    ids = ["a", "b", "c", "d"]

    def server(value: float) -> Any:
        return lambda state, rnd: {"w": state["w"] + np.array([1.0, value])}

    full, _, _ = fltrust_aggregate(deltas, np.array([1.0, 0.0]))
    # Execute
    half, weights, _ = FLTrust(server(0.0), server_lr=0.5).combine(1, reference, ids, deltas,
                                                                   ["w"])
    kept, zero, extra = FLTrust(server(np.nan)).combine(1, reference, ids, deltas, ["w"])
    # Assert: alpha scales the step, not the weights; a NaN server update trusts nobody
    assert full is not None and half is not None
    np.testing.assert_allclose(half, 0.5 * full)
    assert weights.sum() == pytest.approx(1.0)
    assert kept is None and zero.tolist() == [0.0] * 4 and "not finite" in extra["kept_global"]
    with pytest.raises(ValueError, match=r"server_lr=0\.0 must be a finite number > 0"):
        FLTrust(server(0.0), server_lr=0.0)


def test_foolsgold_strategy_zeroes_the_sybil_pair_over_rounds(tmp_path: Any) -> None:
    rounds = run_peer("foolsgold", tmp_path)
    for rec in rounds[1:]:
        w = rec["weights"]
        assert w["c3"] == 0.0 and w["c5"] == 0.0  # identical histories
        assert min(w["c0"], w["c1"], w["c2"]) > 0.15  # distinct honest clients keep theirs
        assert sum(w.values()) == pytest.approx(1.0)
    # c4 is distinct too: FoolsGold does not stop a lone attacker (FLTrust above does)
    assert rounds[3]["weights"]["c4"] > 0
