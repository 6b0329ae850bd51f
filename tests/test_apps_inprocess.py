"""The real ClientApp and ServerApp code (torch, MNIST) over an in-process grid: no Ray.

6 clients x 3 rounds for FedOwen and two baselines, with small partitions so it stays fast.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from client_app.app import app as client_app
from server_app.app import run
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid


def small_run_config(shared_data_dir: Path, out: Path, **extra: Any) -> dict[str, Any]:
    return {"dataset": "mnist", "data-dir": str(shared_data_dir), "output-dir": str(out),
            "num-server-rounds": 3, "clients-per-round": 4, "client-max-samples": 300,
            "test-max-samples": 500, "alpha": 10.0, "imbalance-factor": 1.0, **extra}


@pytest.mark.parametrize("valuation", ["owen", "gtg-shapley", "none"])
def test_server_and_clients_in_process(valuation: str, shared_data_dir: Path,
                                       tmp_path: Path) -> None:
    # Prepare
    run_config = small_run_config(shared_data_dir, tmp_path, valuation=valuation)
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    grid = InProcessGrid(client_app, nodes, run_config)
    # Execute
    summary = run(grid, parse_run_config(run_config), tmp_path)
    # Assert: 3 rounds of 4 clients each, records, ledger and final model on disk
    rounds = read_rounds(tmp_path)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert all(len(r["returned"]) == 4 and not r["failed"] for r in rounds[1:])
    assert all(sum(r["weights"].values()) == pytest.approx(1.0) for r in rounds[1:])
    assert summary["final_test_accuracy"] == pytest.approx(rounds[3]["test_accuracy"])
    # three rounds of one local epoch on 300 samples lift a random LeNet well above chance
    assert rounds[3]["test_accuracy"] > rounds[0]["test_accuracy"] + 0.2
    with (tmp_path / "ledger.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 3 * 4
    state = torch.load(tmp_path / "final_model.pt")
    from fedowen_task.models import build_model

    reference = build_model("lenet", 1, 10).state_dict()
    assert list(state) == list(reference)
    assert all(state[k].shape == v.shape for k, v in reference.items())
    assert all(r["round_seconds"] > 0 for r in rounds[1:])
    # the payout ledger is written for runs that value clients (valuation none values nobody)
    assert (tmp_path / "payouts.csv").is_file() == (valuation != "none")
    # and the run's plots: accuracy and loss always, the ledger where there is one
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 0
    assert (tmp_path / "plots" / "payouts.png").is_file() == (valuation != "none")
    if valuation != "none":
        assert all(0 < r["n_evals"] <= 4 * 4 for r in rounds[1:])
        assert all(r["nu_full"] is not None for r in rounds[1:])


def test_flower_strategy_swap_records_rounds(shared_data_dir: Path, tmp_path: Path) -> None:
    # Flower's own FedProx with the real ClientApp (which applies proximal-mu)
    run_config = small_run_config(shared_data_dir, tmp_path, strategy="fedprox",
                                  **{"proximal-mu": 0.1, "num-server-rounds": 2})
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    summary = run(InProcessGrid(client_app, nodes, run_config), parse_run_config(run_config),
                  tmp_path)
    rounds = read_rounds(tmp_path)
    assert [r["round"] for r in rounds] == [0, 1, 2] and summary["strategy"] == "fedprox"
    assert all(r["strategy"] == "fedprox" and len(r["selected"]) == 4 for r in rounds[1:])
    assert all(sorted(r["returned"]) == sorted(r["selected"]) for r in rounds[1:])
    assert rounds[2]["test_accuracy"] > rounds[0]["test_accuracy"] + 0.2
    assert (tmp_path / "checkpoint.npz").is_file()


def test_fedavgm_runs_and_the_validation_set_is_scored_every_round(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Flower's FedAvgM (the tuned baseline of the confirmation) with a validation split
    run_config = small_run_config(
        shared_data_dir, tmp_path, strategy="fedavgm", **{
            "num-server-rounds": 2, "validation-fraction": 0.05,
            "strategy-params": "server_learning_rate=0.5 server_momentum=0.7"})
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    run(InProcessGrid(client_app, nodes, run_config), parse_run_config(run_config), tmp_path)
    rounds = read_rounds(tmp_path)
    assert all(r["strategy"] == "fedavgm" for r in rounds[1:])
    # the validation accuracy is a second, independent score of the same model
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in rounds)
    assert rounds[2]["val_accuracy"] > rounds[0]["val_accuracy"] + 0.2
    assert rounds[2]["val_accuracy"] != rounds[2]["test_accuracy"]
    # and without one, nothing is recorded
    plain = small_run_config(shared_data_dir, tmp_path / "plain", **{"num-server-rounds": 1})
    run(InProcessGrid(client_app, nodes, plain), parse_run_config(plain), tmp_path / "plain")
    assert all("val_accuracy" not in r for r in read_rounds(tmp_path / "plain"))


@pytest.mark.parametrize(("strategy", "attack"), [("fltrust", "disguised-free-rider"),
                                                  ("foolsgold", "colluding-sybil")])
def test_peer_defences_run_the_real_apps_under_attack(strategy: str, attack: str,
                                                      shared_data_dir: Path,
                                                      tmp_path: Path) -> None:
    # Prepare: 2 of 6 clients attack; all 6 train every round
    run_config = small_run_config(shared_data_dir, tmp_path, strategy=strategy, **{
        "num-server-rounds": 2, "clients-per-round": 6, "adversary-fraction": 0.34,
        "adversary-kind": attack})
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    # Execute
    run(InProcessGrid(client_app, nodes, run_config), parse_run_config(run_config), tmp_path)
    # Assert: per-client weights recorded, who attacked recorded, the model learned
    rounds = read_rounds(tmp_path)
    assert all(r["strategy"] == strategy and len(r["weights"]) == 6 for r in rounds[1:])
    assert all(sum(r["weights"].values()) == pytest.approx(1.0) for r in rounds[1:])
    attackers = json.loads((tmp_path / "adversaries.json").read_text())
    assert attackers["kind"] == attack and len(attackers["ids"]) == 2
    assert rounds[2]["test_accuracy"] > rounds[0]["test_accuracy"] + 0.2
    if strategy == "fltrust":  # noise is orthogonal to the root-set update: (almost) no trust
        assert all(r["weights"][a] < 0.05 for r in rounds[1:] for a in attackers["ids"])
    else:  # the two Sybil copies share one history: FoolsGold zeroes both
        assert all(r["weights"][a] == 0.0 for r in rounds[1:] for a in attackers["ids"])


def test_too_few_nodes_fail_fast_naming_the_fix(tmp_path: Path) -> None:
    # Flower's default federation simulates 2 nodes; 10 per round must fail, not hang
    run_config = {"output-dir": str(tmp_path), "node-wait-timeout": 1.0}
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": 2}
                                      for i in range(2)], run_config)
    with pytest.raises(RuntimeError, match=r'--federation-config "num-supernodes=100"'):
        run(grid, parse_run_config(run_config), tmp_path)
    assert not (tmp_path / "rounds.jsonl").exists()  # nothing ran, no data was loaded


def test_at_least_half_the_nodes_run_with_k_capped(shared_data_dir: Path,
                                                   tmp_path: Path) -> None:
    run_config = small_run_config(shared_data_dir, tmp_path, **{
        "clients-per-round": 6, "num-server-rounds": 1, "node-wait-timeout": 1.0,
        "valuation": "none"})
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": 4}
                                      for i in range(4)], run_config)
    run(grid, parse_run_config(run_config), tmp_path)
    assert len(read_rounds(tmp_path)[1]["returned"]) == 4


def test_federated_evaluation_reaches_the_clientapp(shared_data_dir: Path,
                                                    tmp_path: Path) -> None:
    # FedOwen is a drop-in FedAvg: with fraction_evaluate > 0 (FedAvg's default; FedOwen's is
    # the app's, 0) it sends evaluate messages, which the ClientApp's evaluate handler must
    # answer
    from flwr.app import ArrayRecord

    from fedowen_strategy import FedOwen
    from fedowen_strategy.round.contribution import ValuationSettings
    from fedowen_task.models import build_model

    # Prepare
    run_config = small_run_config(shared_data_dir, tmp_path, **{"client-max-samples": 100})
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": 4}
                                      for i in range(4)], run_config)
    strategy = FedOwen(valuation=ValuationSettings(method="none"), fraction_evaluate=1.0,
                       min_available_nodes=4, min_evaluate_nodes=4, node_wait_timeout=5.0)
    # Execute
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(
        build_model("lenet", 1, 10, seed=0).state_dict()), num_rounds=1)
    # Assert: every node evaluated the round's model on its partition
    assert sorted(grid.sent[-1]) == [1000, 1001, 1002, 1003]
    metrics = result.evaluate_metrics_clientapp[1]
    assert 0.0 <= metrics["eval-accuracy"] <= 1.0 and metrics["eval-loss"] > 0.0


@pytest.mark.parametrize("strategy", ["fedowen", "fedavg"])
def test_fraction_evaluate_records_the_clients_evaluation(shared_data_dir: Path, tmp_path: Path,
                                                          strategy: str) -> None:
    # Prepare: the app with federated evaluation on (every node evaluates every round)
    run_config = small_run_config(shared_data_dir, tmp_path, **{
        "strategy": strategy, "num-server-rounds": 2, "fraction-evaluate": 1.0})
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": 4}
                                      for i in range(4)], run_config)
    # Execute
    run(grid, parse_run_config(run_config), tmp_path)
    # Assert: each round's record holds the clients' weighted evaluation of its model, beside
    # the central one
    rounds = read_rounds(tmp_path)[1:]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert 0.0 <= r["client_eval"]["eval-accuracy"] <= 1.0 and "test_accuracy" in r


def test_one_client_per_round_runs_on_one_node(shared_data_dir: Path, tmp_path: Path) -> None:
    # A one-device federation: k = 1 and one node (the node-wait rule once, in
    # fedowen_strategy.nodes: k nodes, or half of them after the timeout)
    run_config = small_run_config(shared_data_dir, tmp_path, **{
        "clients-per-round": 1, "num-server-rounds": 2, "node-wait-timeout": 1.0})
    grid = InProcessGrid(client_app, [{"partition-id": 0, "num-partitions": 1}], run_config)
    run(grid, parse_run_config(run_config), tmp_path)
    rounds = read_rounds(tmp_path)
    assert [r["returned"] for r in rounds[1:]] == [["0"], ["0"]]


def test_run_plots_redraws_a_run_and_refuses_an_empty_dir(shared_data_dir: Path,
                                                          tmp_path: Path) -> None:
    from server_app.run_plots import main as plots_main

    out = tmp_path / "run"
    run_config = small_run_config(shared_data_dir, out, **{"num-server-rounds": 1})
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": 6}
                                      for i in range(6)], run_config)
    run(grid, parse_run_config(run_config), out)
    (out / "plots" / "payouts.png").unlink()
    assert plots_main([str(out)]) == 0 and (out / "plots" / "payouts.png").is_file()
    (tmp_path / "empty").mkdir()
    assert plots_main([str(tmp_path / "empty")]) == 2


@pytest.mark.parametrize(("attack", "jitter", "cap"), [
    ("alie", 0.0, "median"), ("ipm", 0.0, "median"), ("adaptive", 0.0, "median"),
    ("adaptive", 0.0, "server"), ("alie", 0.01, "median")])
def test_omniscient_attacks_reach_every_strategy_through_the_serverapp(
        attack: str, jitter: float, cap: str, shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: 2 of 6 clients attack under FedOwen with a norm cap
    run_config = small_run_config(shared_data_dir, tmp_path, **{
        "num-server-rounds": 2, "clients-per-round": 6, "adversary-fraction": 0.34,
        "adversary-kind": attack, "adversary-jitter": jitter, "norm-cap": cap})
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    # Execute
    run(InProcessGrid(client_app, nodes, run_config), parse_run_config(run_config), tmp_path)
    # Assert: the rounds record the attack by the recorded adversaries, with its parameter
    rounds = read_rounds(tmp_path)
    attackers = json.loads((tmp_path / "adversaries.json").read_text())
    assert attackers["server_side"] and len(attackers["ids"]) == 2
    if attack in ("alie", "ipm") and not jitter:
        # the attackers of a round send one vector: exact copies, which FedOwen links in
        # round 1 and never selects again
        assert sorted(rounds[1]["duplicates"][0]) == sorted(attackers["ids"])
        assert not set(rounds[2]["selected"]) & set(attackers["ids"])
    if jitter:  # no longer copies: both attack in both rounds
        assert all("duplicates" not in r and r["attack"]["jitter"] == jitter
                   for r in rounds[1:])
    for rec in (r for r in rounds[1:] if set(r["selected"]) & set(attackers["ids"])):
        entry = rec["attack"]
        assert sorted(entry["clients"]) == sorted(attackers["ids"])
        assert entry["honest"] == 4 and entry["replies"] == 6
        key = {"alie": "z", "ipm": "epsilon", "adaptive": "factors"}[attack]
        assert key in entry
        if attack == "adaptive":  # just under the cap the round applied (median or server)
            assert all(nm <= rec["norm_cap"] * (1 + 1e-6) for nm in entry["norms"])
            assert all(nm >= 0.98 * rec["norm_cap"] for nm in entry["norms"])


@pytest.mark.parametrize("selection", ["power-of-choice", "oort", "posterior", "screened"])
def test_the_field_selectors_and_the_posterior_run_through_both_apps(
        selection: str, shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: 8 clients, 3 a round; Power-of-Choice asks 5 candidates a round
    valuation = {"valuation": "owen-antithetic"} if selection in ("posterior", "screened") else {
        "valuation": "none", "aggregation": "uniform"}
    run_config = small_run_config(shared_data_dir, tmp_path, selection=selection,
                                  **valuation, **{"clients-per-round": 3, "poc-d": 5,
                                                  "selection-cap": 2.0})
    nodes = [{"partition-id": i, "num-partitions": 8} for i in range(8)]
    # Execute
    run(InProcessGrid(client_app, nodes, run_config), parse_run_config(run_config), tmp_path)
    # Assert: every round selected 3; what each selector recorded of its choice
    rounds = read_rounds(tmp_path)[1:]
    assert all(len(r["returned"]) == 3 for r in rounds)
    for r in rounds:
        choice = r["selection"]
        if selection == "power-of-choice":  # the 3 highest of the 5 reported local losses
            losses = dict(zip(choice["candidates"], choice["candidate_losses"], strict=True))
            assert len(losses) == 5 and choice["extra_messages"] == 5
            assert choice["query_examples"] >= 5
            top = sorted(losses, key=lambda c: -losses[c])[:3]
            assert sorted(r["selected"]) == sorted(top)
        elif selection == "oort":
            assert 0.3 <= choice["oort_exploration"] < 0.9
        elif selection == "screened":
            assert choice["how"] == "screened" and 0 <= choice["screened"] <= 8
        else:
            assert choice["how"] in ("uniform", "posterior") and "heterogeneity_p" in choice


def test_a_backdoor_run_records_its_attack_success_every_round(shared_data_dir: Path,
                                                               tmp_path: Path) -> None:
    # Prepare: 2 of 6 clients stamp a 3x3 square on all their images, relabelled 0, x3
    run_config = small_run_config(shared_data_dir, tmp_path, **{
        "num-server-rounds": 2, "adversary-kind": "backdoor", "adversary-fraction": 0.34,
        "adversary-poison-fraction": 1.0, "adversary-boost": 3.0})
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    # Execute
    run(InProcessGrid(client_app, nodes, run_config), parse_run_config(run_config), tmp_path)
    # Assert: a rate in [0, 1] in every round's record, round 0 included; who attacked
    rounds = read_rounds(tmp_path)
    assert all(0.0 <= r["attack_success"] <= 1.0 for r in rounds)
    record = json.loads((tmp_path / "adversaries.json").read_text())
    assert record["kind"] == "backdoor" and len(record["ids"]) == 2
    assert record["trigger"] == "square" and record["poison_fraction"] == 1.0


def test_the_evaluation_schedule_keeps_round_0_every_nth_and_the_reports_last_rounds() -> None:
    from server_app.evaluation import EVAL_TAIL, evaluated
    from sim.results import LAST_K
    from studies.adversarial.attack_costs import COLLAPSE_LAST

    # Execute
    schedule = [r for r in range(101) if evaluated(r, 100, 5)]
    # Assert: 0, 5, ..., 90, then each of the last ten; every=1 is every round
    assert schedule == [*range(0, 91, 5), *range(91, 101)]
    assert all(evaluated(r, 100, 1) for r in range(101))
    # the rounds the reports read (their endpoint, the collapse check) are always measured
    assert EVAL_TAIL >= max(LAST_K, COLLAPSE_LAST)


def test_eval_every_skips_measurements_and_leaves_the_training_as_it_was(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: 13 rounds of FedOwen with a validation set, measured every round and every 4th
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    records = {}
    for every in (1, 4):
        out = tmp_path / f"every{every}"
        cfg = small_run_config(shared_data_dir, out, **{
            "num-server-rounds": 13, "validation-fraction": 0.05, "eval-every": every})
        # Execute
        summary = run(InProcessGrid(client_app, nodes, cfg), parse_run_config(cfg), out)
        records[every] = read_rounds(out)
    # Assert: every 4th round, and the last 10 (4-13), were measured; 1-3 not
    every1, every4 = records[1], records[4]
    measured = [r["round"] for r in every4 if "test_accuracy" in r]
    assert measured == [0, *range(4, 14)]
    assert all("val_accuracy" not in r and "round_seconds" in r for r in every4[1:4])
    # the training is the same: selections, values, weights, and the accuracy where measured
    for a, b in zip(every1, every4, strict=True):
        assert (a["round"], a.get("selected"), a.get("phi"), a.get("weights")) == \
               (b["round"], b.get("selected"), b.get("phi"), b.get("weights"))
        if "test_accuracy" in b:
            assert (a["test_accuracy"], a["val_accuracy"]) == \
                   (b["test_accuracy"], b["val_accuracy"])
    assert summary["final_test_accuracy"] == every1[-1]["test_accuracy"]


def test_eval_every_below_one_is_refused_naming_the_key() -> None:
    from fedowen_task.config import ConfigError

    with pytest.raises(ConfigError, match="eval-every=0 must be >= 1"):
        parse_run_config({"eval-every": 0})
