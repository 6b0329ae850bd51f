"""``statistics-rule``: the aggregate's BatchNorm statistics are the clients' coordinate-wise
weighted median (fedowen_strategy.defences.statistics), by hand, through FedOwen, Flower's
strategies and the peers as the ServerApp wraps them, and through both real apps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord

from client_app.app import app as client_app
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.statistics import (
    guard_statistics,
    median_statistics,
    weighted_median,
)
from fedowen_strategy.replies import record_to_state, state_to_record
from server_app.app import run
from server_app.config import parse_run_config
from server_app.store.records import RunRecorder, read_rounds
from server_app.strategies import build_flower_strategy
from sim.inline_grid import InProcessGrid
from tests.test_statistics_cap import ATTACK_VAR, bn_handler, five_clients, run_bn_toy

USER_MODEL = "tests.user_models:tiny_bn"


def test_the_weighted_median_by_hand() -> None:
    # Prepare: four clients, one coordinate each column
    stack = np.array([[1.0, 4.0], [2.0, 3.0], [3.0, 2.0], [100.0, 1.0]])
    # Execute / Assert: equal weights: the mean of the middle two (2.5 in both columns)
    np.testing.assert_allclose(weighted_median(stack, np.ones(4)), [2.5, 2.5])
    # the last client holds 0.7 of the weight: its values (100, 1) are the median
    np.testing.assert_allclose(weighted_median(stack, np.array([.1, .1, .1, .7])), [100, 1])
    # weights 0.4, 0.1, 0.1, 0.4: sorted column 0 is 1 (0.4), 2 (0.5: exactly half), 3, 100
    # -> (2 + 3) / 2; column 1 sorted 1 (0.4), 2 (0.5) -> (2 + 3) / 2 as well
    np.testing.assert_allclose(weighted_median(stack, np.array([.4, .1, .1, .4])), [2.5, 2.5])
    with pytest.raises(ValueError, match="positive total"):
        weighted_median(stack, np.zeros(4))


def test_one_huge_variance_does_not_move_the_median_and_is_named() -> None:
    # Prepare: the five updates of test_statistics_cap: variances 1.5, 2, 2.5, 3 and 1e6,
    # means 0.5, 1, 1.5, 2 and 0, equal weights
    glob, updates = five_clients()
    states = [u.state for u in updates]
    # Execute
    out = median_statistics(states, [u.client_id for u in updates], np.ones(5), glob)
    # Assert: the middle values, by hand: variance 2.5, mean 1.0
    assert out is not None
    np.testing.assert_allclose(out.statistics["running_var"], [2.5, 2.5])
    np.testing.assert_allclose(out.statistics["running_mean"], [1.0, 1.0])
    assert out.statistics["running_var"].dtype == np.float32
    assert set(out.statistics) == {"running_var", "running_mean"}  # no counter, no weight
    # the record: the mean's variance (1e6 + 9) / 5 is far from the median; c4 is farthest
    assert out.record["statistics_rule"] == "median"
    assert out.record["statistics_shift"] > 1e5
    farthest = out.record["statistics_farthest"]
    assert isinstance(farthest, dict) and farthest["client"] == "c4"


def test_guard_statistics_off_with_a_cap_and_the_median() -> None:
    # Prepare
    glob, updates = five_clients()
    states, ids = [u.state for u in updates], [u.client_id for u in updates]
    # Execute
    off = guard_statistics(states, ids, np.ones(5), glob, rule="mean")
    capped = guard_statistics(states, ids, np.ones(5), glob, rule="mean", cap_multiple=2.0)
    both = guard_statistics(states, ids, np.ones(5), glob, rule="median", cap_multiple=2.0)
    # Assert: off is nothing to do; the cap (2 x lower median 3 = 6, as in test_statistics_cap)
    # puts c4 at variance 1 + 3 sqrt(2), the mean of (1.5, 2, 2.5, 3, 5.243) is 2.849
    assert off is None
    assert capped is not None and capped.record["statistics_cap"] == pytest.approx(6.0)
    np.testing.assert_allclose(capped.statistics["running_var"],
                               (1.5 + 2 + 2.5 + 3 + 1 + 3 * np.sqrt(2)) / 5, rtol=1e-6)
    # with the median after the cap: 2.5 again, and both fields recorded
    assert both is not None
    np.testing.assert_allclose(both.statistics["running_var"], [2.5, 2.5])
    assert {"statistics_cap", "statistics_rule"} <= set(both.record)


def two_layers(a_var: float, b_var: float) -> dict[str, np.ndarray]:
    """Two BatchNorm layers' statistics: a (2 channels) and b (50), means 0."""
    return {"a.running_mean": np.zeros(2, np.float32), "a.running_var": np.full(2, a_var,
                                                                                  np.float32),
            "b.running_mean": np.zeros(50, np.float32), "b.running_var": np.full(50, b_var,
                                                                                 np.float32)}


def test_one_layer_scaled_alone_passes_the_cap_but_not_the_median() -> None:
    # Prepare: honest c0-c3 move layer a's variance to 1.1-1.4 and layer b's to 1.5-3
    # (deviation norms about sqrt(50) x 0.5 x (i + 1) = 3.5, 7.1, 10.6, 14.1); c4 scales its
    # layer a by 10 (1.1 -> 11; deviation sqrt(2) x 10 = 14.1) and sends b as c0 (3.5): its
    # deviation 14.6 is under 3 x the lower median 10.6
    glob = two_layers(1.0, 1.0)
    states = [two_layers(1.0 + 0.1 * (i + 1), 1.0 + 0.5 * (i + 1)) for i in range(4)]
    states.append(two_layers(11.0, 1.5))
    ids = [f"c{i}" for i in range(5)]
    # Execute
    capped = guard_statistics(states, ids, np.ones(5), glob, rule="mean", cap_multiple=3.0)
    median = guard_statistics(states, ids, np.ones(5), glob, rule="median")
    # Assert: the cap lets c4 through and layer a's variance is (1.1 + ... + 1.4 + 11) / 5 =
    # 3.2; the median's is the middle value, 1.3, among the honest ones
    assert capped is not None and capped.record["statistics_capped"] == {}
    np.testing.assert_allclose(capped.statistics["a.running_var"], 3.2, rtol=1e-6)
    assert median is not None
    np.testing.assert_allclose(median.statistics["a.running_var"], 1.3, rtol=1e-6)
    np.testing.assert_allclose(median.statistics["b.running_var"], 2.0, rtol=1e-6)


def test_the_default_rule_is_the_median() -> None:
    assert Guards().statistics_rule == "median"
    assert Guards.problems_of({"statistics_rule": "mode"}) == [
        "statistics_rule='mode' is not one of median, mean"]


def test_through_fedowen_the_default_holds_the_global_variance_among_the_honest_ones() -> None:
    # Execute: 3 rounds, six clients, c5 sends running_var 1e6 every round
    guarded = run_bn_toy()
    open_ = run_bn_toy(statistics_rule="mean")
    # Assert: honest variances are 1.1-1.5: the median lies among them; the mean does not
    assert np.all((guarded["bn.running_var"] >= 1.1) & (guarded["bn.running_var"] <= 1.5))
    assert np.all(open_["bn.running_var"] > 1e3), open_["bn.running_var"]


def run_wrapped(name: str, tmp_path: Path) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """``strategy = name`` as the ServerApp builds it, over the BatchNorm toy's six clients
    (c5 sends running_var 1e6) for 2 rounds: the final model and the round records."""
    cfg = parse_run_config({"strategy": name, "clients-per-round": 6})
    recorder = RunRecorder(tmp_path)
    strategy = build_flower_strategy(cfg, 6, recorder.log_train)
    init = {"w": np.zeros(4, np.float32), "bn.running_mean": np.zeros(2, np.float32),
            "bn.running_var": np.ones(2, np.float32),
            "bn.num_batches_tracked": np.array(0, np.int64)}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        recorder.log_eval(server_round, {"loss": 0.0})
        return MetricRecord({"loss": 0.0})

    result = strategy.start(grid=InProcessGrid(bn_handler, [{"partition-id": i}
                                                            for i in range(6)]),
                            initial_arrays=state_to_record(init), num_rounds=2,
                            evaluate_fn=evaluate)
    return record_to_state(result.arrays), read_rounds(tmp_path)


@pytest.mark.parametrize("name", ["fedavg", "krum", "fedmedian", "foolsgold"])
def test_flowers_strategies_and_the_peers_apply_the_same_rule(name: str, tmp_path: Path) -> None:
    # Execute
    final, rounds = run_wrapped(name, tmp_path)
    # Assert: the median of (1.1, ..., 1.5, 1e6) by the strategy's weights lies among the
    # honest ones (FedAvg alone, by num-examples, would give about 1.7e5); every round
    # records the rule and names c5 as the farthest
    var = final["bn.running_var"]
    assert np.all((var >= 1.1) & (var <= 1.5)), var
    assert var.dtype == np.float32
    for record in rounds[1:]:
        assert record["statistics_rule"] == "median"
        assert record["statistics_farthest"]["client"] == "c5"


def app_config(data: Path, out: Path, **extra: Any) -> dict[str, Any]:
    """The acceptance command at the fast suite's size: CIFAR-10, every key at its default but
    the sizes, a user's BatchNorm network, 10 clients a round, 3 rounds."""
    return {"dataset": "cifar10", "model": USER_MODEL, "data-dir": str(data),
            "output-dir": str(out), "num-server-rounds": 3, "client-max-samples": 50,
            "test-max-samples": 200, **extra}


def final_variances(config: dict[str, Any], out: Path) -> dict[str, np.ndarray]:
    """Run ``config`` over 10 partitions in process; the final model's running variances."""
    nodes = [{"partition-id": i, "num-partitions": 10} for i in range(10)]
    run(InProcessGrid(client_app, nodes, config), parse_run_config(config), out)
    final = torch.load(out / "final_model.pt")
    return {k: v.numpy() for k, v in final.items() if k.endswith("running_var")}


@pytest.fixture(scope="module")
def clean_variances(shared_data_dir: Path, tmp_path_factory: pytest.TempPathFactory
                    ) -> dict[str, np.ndarray]:
    out = tmp_path_factory.mktemp("clean")
    from sim.inline_grid import task_identity

    with task_identity():
        return final_variances(app_config(shared_data_dir, out), out)


@pytest.mark.parametrize(("strategy", "attack"), [
    ("fedowen", "huge-statistics"), ("fedowen", "scaled-statistics"),
    ("fedavg", "huge-statistics"), ("fltrust", "huge-statistics")])
def test_one_client_in_ten_attacking_the_statistics_leaves_every_layer_near_the_clean_run(
        strategy: str, attack: str, clean_variances: dict[str, np.ndarray],
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: one client in ten sends running_var 1e6 (or its own x 4) every round
    config = app_config(shared_data_dir, tmp_path, strategy=strategy, **{
        "adversary-fraction": 0.1, "adversary-kind": attack})
    # Execute
    attacked = final_variances(config, tmp_path)
    # Assert: no BatchNorm layer's largest variance above 10x the clean run's (the median
    # keeps the scaler within 2x); the records name the rule every round
    ratios = {k: float(v.max() / clean_variances[k].max()) for k, v in attacked.items()}
    assert max(ratios.values()) < (2.0 if attack == "scaled-statistics" else 10.0), ratios
    assert max(float(v.max()) for v in attacked.values()) < ATTACK_VAR / 1e3
    rounds = read_rounds(tmp_path)[1:]
    assert all(r["statistics_rule"] == "median" for r in rounds)


def test_with_the_old_rule_the_same_attacker_breaks_the_model(
        clean_variances: dict[str, np.ndarray], shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: the same run with statistics-rule = "mean" (the rule before issue 70)
    config = app_config(shared_data_dir, tmp_path, **{
        "adversary-fraction": 0.1, "adversary-kind": "huge-statistics",
        "statistics-rule": "mean"})
    # Execute
    attacked = final_variances(config, tmp_path)
    # Assert: the check above can fail: the mean lets 1e6 in at the attacker's weight
    ratios = [float(v.max() / clean_variances[k].max()) for k, v in attacked.items()]
    assert max(ratios) > 100.0, ratios
    assert all("statistics_rule" not in r for r in read_rounds(tmp_path)[1:])
