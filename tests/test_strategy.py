"""FedOwen over an in-process grid with a closed-form toy task (no torch, no Ray).

Each client holds the model w in R^4 and moves it toward a common target; "bad" clients
(ids 4 and 5) move it away. The utility of a coalition is minus the distance of its averaged
model to the target, so good clients must be valued above bad ones.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.replies import record_to_state, state_to_record
from fedowen_strategy.round.aggregation import example_weights
from fedowen_strategy.round.contribution import ValuationSettings
from fedowen_strategy.selectors.adaptive import AdaptiveSettings
from fedowen_strategy.selectors.shared import SelectionParams
from fedowen_strategy.strategy import FedOwen
from server_app.store.records import RunRecorder, read_rounds
from sim.inline_grid import InProcessGrid

TARGET = np.array([1.0, -2.0, 0.5, 3.0])
BAD = {4, 5}
#: The guards off: the toy tests measure valuation, selection and the message path alone
#: (tests/test_defences.py measures the guards).
BARE = {"max_norm_ratio": 0.0, "norm_cap": "none", "link_cosine": 0.0,
        "duplicate_tolerance": 0.0}


def toy_handler(msg: Message, ctx: Context) -> Message:
    pid = int(ctx.node_config["partition-id"])
    if msg.metadata.message_type == "query":  # the strategy asks new nodes for their ids
        return Message(RecordDict({"client": ConfigRecord({"client-id": f"c{pid}"})}),
                       reply_to=msg)
    w = record_to_state(msg.content["arrays"])["w"]
    if pid == int(ctx.node_config.get("crash-id", -1)):
        raise RuntimeError("simulated client crash")
    if pid == int(ctx.node_config.get("silent-id", -1)):
        raise TimeoutError  # the grid sends no reply: a timed-out or disconnected node
    step = -(TARGET - w) if pid in BAD else 0.5 * (TARGET - w)
    new = {"w": (w + step + 0.01 * pid).astype(np.float32)}
    if pid == int(ctx.node_config.get("nan-id", -1)):
        new["w"][0] = np.nan
    return Message(
        RecordDict(
            {
                "arrays": state_to_record(new),
                "metrics": MetricRecord({"num-examples": 10 + pid, "train-loss": 1.0}),
                "client": ConfigRecord({"client-id": f"c{pid}"}),
            }
        ),
        reply_to=msg,
    )


def toy_utility(
    global_state: Mapping[str, np.ndarray],
    states: Sequence[Mapping[str, np.ndarray]],
    examples: Sequence[int],
) -> Any:
    ws = np.stack([s["w"] for s in states]).astype(np.float64)
    n_ex = np.asarray(examples, dtype=np.float64)

    def utility(masks: np.ndarray) -> np.ndarray:
        out = np.empty(len(masks))
        for r, m in enumerate(masks):
            w = global_state["w"] if not m.any() else (n_ex[m] @ ws[m]) / n_ex[m].sum()
            out[r] = -np.linalg.norm(w - TARGET)
        return out

    return utility


def run_toy(
    method: str,
    rounds: int = 3,
    k: int = 6,
    tmp_path: Any = None,
    node_extra: dict[str, Any] | None = None,
    aggregation: str = "auto",
    handler: Any = toy_handler,
    **kwargs: Any,
) -> FedOwen:
    nodes = [{"partition-id": i, **(node_extra or {})} for i in range(6)]
    recorder = RunRecorder(tmp_path) if tmp_path is not None else None
    guard_keys = [key for key in kwargs if key in Guards.__dataclass_fields__]
    strategy = FedOwen(
        clients_per_round=k,
        utility_factory=toy_utility,
        valuation=ValuationSettings(method=method, budget_m=10, aggregation=aggregation,
                                    game="average"),
        guards=Guards(**{**BARE, **{key: kwargs.pop(key) for key in guard_keys}}),
        on_round=recorder.log_train if recorder else None,
        seed=3,
        **kwargs,
    )
    init = state_to_record({"w": np.zeros(4, np.float32)})

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        dist = float(np.linalg.norm(record_to_state(arrays)["w"] - TARGET))
        if recorder is not None:
            recorder.log_eval(server_round, {"distance": dist})
        return MetricRecord({"distance": dist})

    strategy.result = strategy.start(
        grid=InProcessGrid(handler, nodes),
        initial_arrays=init,
        num_rounds=rounds,
        evaluate_fn=evaluate,
    )
    return strategy


@pytest.mark.parametrize("method", ["owen", "mc-shapley", "none"])
def test_start_runs_six_clients_three_rounds(method: str, tmp_path: Any) -> None:
    # Execute
    strategy = run_toy(method, tmp_path=tmp_path)
    # Assert: every round aggregated all 6, records written, the model moved toward the target
    rounds = read_rounds(tmp_path)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert all(len(r["returned"]) == 6 for r in rounds[1:])
    dist = strategy.result.evaluate_metrics_serverapp
    if method == "none":
        # FedAvg: the two adversaries cancel the four good steps (4 x 0.5 = 2 x 1)
        np.testing.assert_allclose(
            list(rounds[1]["weights"].values()), example_weights([10, 11, 12, 13, 14, 15])
        )
    else:
        assert dist[3]["distance"] < 0.75 * dist[0]["distance"]
        phi = rounds[1]["phi"]
        assert min(phi[f"c{i}"] for i in range(4)) > max(phi[f"c{i}"] for i in BAD)
        assert rounds[1]["n_evals"] <= 6 * 10
        # l1 scale (the default): a round's absolute values sum to 1
        assert abs(sum(abs(v) for v in phi.values()) - 1.0) < 1e-6
        # softmax weights favour the good clients
        w = rounds[1]["weights"]
        assert min(w[f"c{i}"] for i in range(4)) > max(w[f"c{i}"] for i in BAD)
    ledger = (tmp_path / "ledger.csv").read_text().splitlines()
    assert ledger[0].startswith("client_id,round,phi") and len(ledger) == 1 + 3 * 6


def test_state_is_keyed_by_client_id_and_counts_only_returns() -> None:
    # Prepare: client 2 crashes every round; Algorithm 2's memory (its counts)
    strategy = run_toy("owen", rounds=2, node_extra={"crash-id": 2}, selection="adaptive")
    # Assert: the crashed client is never counted nor valued; others counted twice
    memory = strategy.chooser.selector.state()
    assert "c2" not in memory["counts"] and "c2" not in memory["phi"]
    assert all(strategy.chooser.selector.counts[f"c{i}"] == 2 for i in (0, 1, 3, 4, 5))
    # every node named itself before round 1, the crashing one too
    assert set(strategy.client_of_node.values()) == {f"c{i}" for i in range(6)}


def test_silent_client_costs_nothing_but_its_update(tmp_path: Any) -> None:
    strategy = run_toy("owen", rounds=2, tmp_path=tmp_path, node_extra={"silent-id": 3},
                       selection="adaptive")  # Algorithm 2's memory (its counts)
    rounds = read_rounds(tmp_path)
    assert all(len(r["returned"]) == 5 and "c3" not in r["returned"] for r in rounds[1:])
    memory = strategy.chooser.selector.state()
    assert "c3" not in memory["counts"] and "c3" not in memory["phi"]
    # the timed-out client is counted as failed (under the id its node named at the query)
    assert all(list(r["failed"]) == ["c3"] for r in rounds[1:])
    assert "no reply" in rounds[1]["failed"]["c3"]


def _nasty(kind: str, good: Message) -> Message:
    """A copy of ``good`` (a valid reply) broken in one way."""
    from flwr.app import Array

    content = good.content
    metrics = content.metric_records["metrics"]
    if kind == "half-example":
        metrics["num-examples"] = 0.5
    elif kind == "huge-count":
        metrics["num-examples"] = 1e300
    elif kind == "loss-list":
        metrics["train-loss"] = [1.0, 2.0]
    elif kind == "no-metrics":
        del content["metrics"]
    elif kind == "undecodable":
        content["arrays"] = ArrayRecord(array_dict={"w": Array(
            dtype="float32", shape=(4,), stype="numpy.ndarray", data=b"123")})
    elif kind == "wrong-key":
        content["arrays"] = state_to_record({"v": np.zeros(4, np.float32)})
    elif kind == "empty":
        return Message(RecordDict(), reply_to=good)
    return good


NASTY = ["half-example", "huge-count", "loss-list", "no-metrics", "undecodable", "wrong-key",
         "empty"]


@pytest.mark.parametrize("kind", NASTY)
def test_no_single_reply_can_end_a_run(kind: str, tmp_path: Any) -> None:
    # Prepare: client 2 sends a broken reply every round
    def handler(msg: Message, ctx: Context) -> Message:
        reply = toy_handler(msg, ctx)
        return _nasty(kind, reply) if int(ctx.node_config["partition-id"]) == 2 else reply

    # Execute (Algorithm 2: its memory counts the returns)
    strategy = run_toy("owen", rounds=2, tmp_path=tmp_path, handler=handler,
                       selection="adaptive")
    # Assert: both rounds aggregated the five others; client 2 never counted
    rounds = read_rounds(tmp_path)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(len(r["returned"]) == 5 and "c2" not in r["returned"] for r in rounds[1:])
    assert all(len(r["rejected"]) == 1 for r in rounds[1:]), rounds[1]["rejected"]
    assert "c2" not in strategy.chooser.selector.counts


def test_malformed_update_is_rejected_and_round_goes_on(tmp_path: Any) -> None:
    run_toy("owen", rounds=1, tmp_path=tmp_path, node_extra={"nan-id": 1})
    record = read_rounds(tmp_path)[1]
    assert "c1" in record["rejected"] and "NaN" in record["rejected"]["c1"]
    assert len(record["returned"]) == 5


def test_adaptive_selection_prefers_good_clients_over_rounds() -> None:
    # Prepare: 2 of 6 per round, exploitation only, strong scores
    strategy = run_toy(
        "owen", rounds=12, k=2, selection=AdaptiveSettings(epsilon=0.0, c=0.05, tau=0.0)
    )
    # Assert: bad clients (negative phi, below tau) are chosen rarely once valued
    good = sum(strategy.chooser.selector.counts.get(f"c{i}", 0) for i in range(4))
    bad = sum(strategy.chooser.selector.counts.get(f"c{i}", 0) for i in BAD)
    assert good > 3 * bad


def test_same_seed_same_run() -> None:
    # the default selector (auto), and Algorithm 2 with its remembered phi
    a = run_toy("owen", rounds=3, k=3)
    b = run_toy("owen", rounds=3, k=3)
    assert a.chooser.picks == b.chooser.picks
    assert a.chooser.rng.bit_generator.state == b.chooser.rng.bit_generator.state
    a = run_toy("owen", rounds=3, k=3, selection="adaptive")
    b = run_toy("owen", rounds=3, k=3, selection="adaptive")
    assert a.chooser.selector.counts == b.chooser.selector.counts
    assert a.chooser.selector.phi == pytest.approx(b.chooser.selector.phi)


def test_game_valuation_without_utility_fails_at_construction() -> None:
    with pytest.raises(ValueError, match=r"needs utility_factory: pass .*CoalitionUtility"):
        FedOwen(clients_per_round=3, valuation=ValuationSettings(method="owen"))
    # methods that value no coalitions need none
    assert FedOwen(valuation=ValuationSettings(method="none")).fraction_evaluate == 0.0


def test_drop_in_for_fedavg_arguments_metrics_and_logs() -> None:
    # Prepare: FedAvg's arguments only (k from fraction_train), a custom metric aggregation
    seen: list[int] = []

    def count_and_average(contents: list[RecordDict], key: str) -> MetricRecord:
        seen.append(len(contents))
        losses = [float(c["metrics"]["train-loss"]) for c in contents]
        return MetricRecord({"train-loss": sum(losses) / len(losses), "clients": len(contents)})

    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    library = logging.getLogger("fedowen_strategy")  # the library logs through logging
    level = library.level
    library.setLevel(logging.INFO)
    library.addHandler(handler)
    try:
        strategy = FedOwen(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=6,
                           utility_factory=toy_utility, train_metrics_aggr_fn=count_and_average,
                           valuation=ValuationSettings(method="owen", budget_m=10,
                                                       game="average"), guards=Guards(**BARE))
        result = strategy.start(grid=InProcessGrid(toy_handler, [{"partition-id": i}
                                                                 for i in range(6)]),
                                initial_arrays=state_to_record({"w": np.zeros(4, np.float32)}),
                                num_rounds=2)
    finally:
        library.removeHandler(handler)
        library.setLevel(level)
    # Assert: k = int(6 * 0.5) = 3; client metrics passed through; phi and weights reported
    assert seen == [3, 3]
    metrics = result.train_metrics_clientapp[2]
    assert metrics["clients"] == 3 and metrics["train-loss"] == pytest.approx(1.0)
    phis = {k: v for k, v in metrics.items() if k.startswith("phi/")}
    weights = {k: v for k, v in metrics.items() if k.startswith("weight/")}
    assert len(phis) == 3 and sum(weights.values()) == pytest.approx(1.0)  # type: ignore[arg-type]
    assert metrics["n-evals"] > 0 and metrics["valuation-seconds"] >= 0  # type: ignore[operator]
    assert any(m.startswith("aggregate_train: round 2, 3 updates valued by owen")
               for m in messages)


def test_links_seen_in_rounds_reach_the_selection_with_link_memory() -> None:
    # Prepare: the four good toy clients step nearly in parallel (cosine > 0.98), and so do
    # the two bad ones
    keys = [f"c{i}" for i in range(6)]
    # Execute
    remembered = run_toy("owen", rounds=2, link_cosine=0.98,
                         selection_params=SelectionParams(link_memory=2))
    forgotten = run_toy("owen", rounds=2, link_cosine=0.98)
    # Assert: linked in both rounds, so with link-memory 2 each group is one arm; without it
    # the bandit keeps no links
    arms = remembered.chooser.arms(keys)
    assert arms is not None and arms.tolist() == [0, 0, 0, 0, 1, 1]
    assert remembered.chooser.pair_links[("c0", "c1")] == 2
    assert forgotten.chooser.pair_links == {} and forgotten.chooser.arms(keys) is None


def test_one_server_step_a_round_however_many_defences_read_it(tmp_path: Any) -> None:
    # Prepare: the server-direction filter and the server norm cap both read the server's step
    calls: list[int] = []

    def server_step(global_state: Mapping[str, np.ndarray], server_round: int
                    ) -> dict[str, np.ndarray]:
        calls.append(server_round)
        return {"w": np.asarray(global_state["w"]) + (TARGET - global_state["w"]) * 0.1}

    # Execute
    run_toy("owen", rounds=3, tmp_path=tmp_path, server_step=server_step,
            update_filter="server-direction", norm_cap="server")
    # Assert: trained once in each round, not once per reader
    assert calls == [1, 2, 3]
    assert all("server_cosines" in r for r in read_rounds(tmp_path)[1:])
