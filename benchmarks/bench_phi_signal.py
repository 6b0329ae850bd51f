"""How much of phi is signal: rank agreement of one round's contributions across evaluation sets
and estimator seeds (issue 11, "signal before weighting").

A recorded round: equal-weight FedAvg runs ``--rounds-before`` rounds of the paper's setting
(MNIST, IF 0.01, 100 clients, 10 per round, per-class split, the app's local recipe) through
the inline backend; then ten clients drawn with a seeded generator train one round from that
global model through the real ClientApp. Their updates are valued with the app's estimator
(``owen``, budget 10 x M = 40 utility calls) in the delta game (equal shares), under

- the utility ``accuracy`` and ``neg-loss`` (minus the mean cross-entropy);
- evaluation sets of 1% (600 images) and 5% (3,000 images) of the training split's size, drawn
  stratified from the MNIST *test* split (which no client holds): two disjoint sets A and B of
  each size.

Per (alpha, recorded round, utility, size) it records the Spearman correlation of phi between
set A and set B (seed 0: utility noise plus estimator noise) and between estimator seeds 0 and 1
on set A (estimator noise alone), and how many clients keep phi's sign across A and B.

    PYTHONPATH=. python benchmarks/bench_phi_signal.py --out docs/results/phi-signal

writes ``signal.jsonl`` (one line per recorded round and setting; finished ones are skipped on a
rerun), ``signal.csv`` and ``README.md`` (median and range over the recorded rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from scipy.stats import spearmanr

from client_app.app import train_handler
from fedowen_strategy.replies import record_to_state
from fedowen_strategy.round.round_valuers import delta_shares
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_strategy.valuation import estimate
from fedowen_task.data import load_dataset, to_tensor
from fedowen_task.models import build_model
from fedowen_task.protocol import NUM_EXAMPLES_FIELD
from sim.inline import run_cell
from sim.inline_grid import task_identity

METRICS = ("accuracy", "neg-loss")
SIZES = {"1%": 600, "5%": 3000}
CLIENTS, BUDGET_M, NUM_PARTITIONS = 10, 4, 100


def base_config(alpha: float, seed: int, data_dir: Path) -> dict[str, Any]:
    """The ablation protocol's run config for equal-weight FedAvg."""
    return {"dataset": "mnist", "data-dir": str(data_dir), "imbalance-factor": 0.01,
            "alpha": alpha, "partition-scheme": "per-class", "clients-per-round": CLIENTS,
            "seed": seed, "valuation": "none", "selection": "random",
            "aggregation": "uniform", "torch-threads": 1}


def recorded_round(alpha: float, rounds_before: int, seed: int, data_dir: Path
                   ) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]], list[int]]:
    """The global model after ``rounds_before`` rounds and ten clients' updates from it."""
    cfg = base_config(alpha, seed, data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        run_cell({**cfg, "num-server-rounds": rounds_before, "output-dir": tmp}, NUM_PARTITIONS)
        state = torch.load(Path(tmp) / "final_model.pt", weights_only=True)
    record = ArrayRecord({k: v for k, v in state.items()})
    clients = np.random.default_rng([seed, rounds_before]).choice(NUM_PARTITIONS, CLIENTS,
                                                                    replace=False)
    states, examples = [], []
    for pid in sorted(int(c) for c in clients):
        ctx = Context(run_id=1, node_id=pid + 1, state=RecordDict(),
                      node_config={"partition-id": pid, "num-partitions": NUM_PARTITIONS},
                      run_config=cfg)
        msg = Message(RecordDict({"arrays": record, "config": ConfigRecord(
            {"server-round": rounds_before + 1})}), message_type=MessageType.TRAIN,
            dst_node_id=pid + 1)
        reply = train_handler(msg, ctx)
        n = reply.content.metric_records["metrics"][NUM_EXAMPLES_FIELD]
        assert isinstance(n, int)
        states.append(record_to_state(reply.content.array_records["arrays"]))
        examples.append(n)
    return record_to_state(record), states, examples


def eval_sets(seed: int) -> dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]]:
    """Disjoint stratified sets A and B of each size from the MNIST test split."""
    ds = load_dataset("mnist")
    rng = np.random.default_rng(seed)
    per_class = {c: rng.permutation(np.flatnonzero(ds.y_test == c)) for c in range(10)}
    out = {}
    for name, size in SIZES.items():
        k = size // 10
        for i, half in enumerate("AB"):
            idx = np.sort(np.concatenate([p[i * k:(i + 1) * k] for p in per_class.values()]))
            out[(name, half)] = (to_tensor(ds.x_test[idx], "mnist"),
                                 torch.as_tensor(ds.y_test[idx], dtype=torch.long))
    return out


def phi(glob: dict[str, np.ndarray], states: list[dict[str, np.ndarray]], examples: list[int],
        x: torch.Tensor, y: torch.Tensor, metric: str, seed: int) -> np.ndarray:
    """The app's owen estimate in the delta game with equal shares."""
    factory = CoalitionUtility(build_model("lenet", 1, 10), x, y, metric=metric, device="cpu")
    game = factory(glob, states, examples, shares=delta_shares("uniform", examples))
    result = estimate("owen", game, len(states), budget=len(states) * BUDGET_M, seed=seed)
    return np.asarray(result.values, dtype=np.float64)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def measure(alpha: float, rounds_before: int, seed: int, data_dir: Path) -> list[dict[str, Any]]:
    """Every (utility, size) line of one recorded round."""
    glob, states, examples = recorded_round(alpha, rounds_before, seed, data_dir)
    sets = eval_sets(seed)
    lines = []
    for metric in METRICS:
        for size in SIZES:
            a0 = phi(glob, states, examples, *sets[(size, "A")], metric, 0)
            a1 = phi(glob, states, examples, *sets[(size, "A")], metric, 1)
            b0 = phi(glob, states, examples, *sets[(size, "B")], metric, 0)
            lines.append({"alpha": alpha, "round": rounds_before + 1, "seed": seed,
                          "metric": metric, "size": size, "examples": examples,
                          "phi_a": a0.tolist(), "phi_a_seed1": a1.tolist(), "phi_b": b0.tolist(),
                          "spearman_sets": _spearman(a0, b0),
                          "spearman_seeds": _spearman(a0, a1),
                          "sign_kept": int(np.sum(np.sign(a0) == np.sign(b0)))})
    return lines


def _summary(values: list[float]) -> str:
    vals = [v for v in values if v == v]
    if not vals:
        return "-"
    return f"{statistics.median(vals):.2f} [{min(vals):.2f}, {max(vals):.2f}]"


def write_report(out: Path, lines: list[dict[str, Any]], command: str) -> None:
    """``signal.csv`` and ``README.md``: per (alpha, utility, size), median [min, max] over the
    recorded rounds."""
    with (out / "signal.csv").open("w") as fh:
        fh.write("alpha,round,seed,metric,size,spearman_sets,spearman_seeds,sign_kept\n")
        for r in lines:
            fh.write(f"{r['alpha']},{r['round']},{r['seed']},{r['metric']},{r['size']},"
                     f"{r['spearman_sets']:.4f},{r['spearman_seeds']:.4f},{r['sign_kept']}\n")
    rows = ["| alpha | utility | eval set | Spearman A vs B | Spearman seed 0 vs 1 | "
            "sign kept A vs B (of 10) | rounds |", "|---|---|---|---|---|---|---|"]
    for alpha in sorted({r["alpha"] for r in lines}, reverse=True):
        for metric in METRICS:
            for size in SIZES:
                group = [r for r in lines if (r["alpha"], r["metric"], r["size"]) ==
                         (alpha, metric, size)]
                if group:
                    rows.append(
                        f"| {alpha} | {metric} | {size} ({SIZES[size]}) | "
                        f"{_summary([r['spearman_sets'] for r in group])} | "
                        f"{_summary([r['spearman_seeds'] for r in group])} | "
                        f"{_summary([float(r['sign_kept']) for r in group])} | {len(group)} |")
    (out / "README.md").write_text(
        "# How much of phi is signal\n\n"
        f"Produced by `{command}` (setup in benchmarks/bench_phi_signal.py): recorded rounds of "
        "the paper's setting (MNIST, IF 0.01, per-class split, 100 clients, equal-weight FedAvg "
        "up to the round, then 10 seeded clients train once), valued with `owen` (budget 40) "
        "in the delta game. A and B: disjoint stratified sets from the MNIST test split. "
        "Median [min, max] over the recorded rounds (`signal.csv` has each):\n\n"
        + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("docs/results/phi-signal"))
    p.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    p.add_argument("--alphas", type=float, nargs="*", default=[0.1, 0.01])
    p.add_argument("--rounds-before", type=int, nargs="*", default=[10, 30, 60])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "signal.jsonl"
    lines = [json.loads(s) for s in path.read_text().splitlines()] if path.exists() else []
    done = {(r["alpha"], r["round"] - 1, r["seed"]) for r in lines}
    with task_identity():
        for alpha in args.alphas:
            for before in args.rounds_before:
                if (alpha, before, args.seed) in done:
                    continue
                new = measure(alpha, before, args.seed, args.data_dir.resolve())
                with path.open("a") as fh:
                    fh.writelines(json.dumps(r) + "\n" for r in new)
                lines += new
                print(f"alpha {alpha} round {before + 1}: " + ", ".join(
                    f"{r['metric']}/{r['size']} {r['spearman_sets']:.2f}" for r in new),
                    flush=True)
    command = "python benchmarks/bench_phi_signal.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    write_report(args.out, lines, command.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
