"""Poisoning attacks against FedOwen and FedAvg, with and without the robust update bounds.

Every run is the real ServerApp (``server_app.app.run``) and ClientApp (``train_handler``)
over the in-process grid of the tests (no Ray): MNIST, 6 clients of which one (chosen by
``fedowen_task.adversary.keys.adversary_ids`` with fraction 1/6) attacks, 4 clients per round.

Attacks (the issue's probes and the project's adversaries):

- ``random-9.5x``: the attacker returns the global model plus a random direction whose norm is
  9.5 x the global model's norm (passes ``max-norm-ratio = 10``);
- ``scaled-20x``: the attacker trains honestly and returns its update scaled by -20;
- ``label-flip``, ``noise``: the ClientApp's own adversaries (``adversary-kind``);
- ``clean``: nobody attacks (what the bounds cost honest runs).

Bounds: ``off`` (``update-bound = "none"``: only the old ``max-norm-ratio = 10`` guard),
``clip`` and ``reject`` (3 x the round's lower-median update norm).

    PYTHONPATH=. python benchmarks/bench_attacks.py --out docs/results/attack-bounds

writes ``runs.jsonl`` (one line per run, appended; finished runs are skipped on a rerun),
``final_accuracy.csv`` and ``README.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from client_app.app import train_handler
from fedowen_task.adversary.keys import adversary_ids
from fedowen_task.protocol import NUM_EXAMPLES_FIELD
from server_app.app import run
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid, task_identity

ATTACKS = ("clean", "random-9.5x", "scaled-20x", "label-flip", "noise")
BOUNDS = ("off", "clip", "reject")
VALUATIONS = ("owen", "none")
NUM_CLIENTS, FRACTION = 6, 1 / 6


def _float_keys(state: dict[str, torch.Tensor]) -> list[str]:
    return [k for k, v in state.items() if v.is_floating_point()]


def _with_state(reply: Message, state: dict[str, torch.Tensor]) -> Message:
    reply.content["arrays"] = ArrayRecord(state)
    return reply


def attacker_handler(attack: str, seed: int) -> Callable[[Message, Context], Message]:
    """``train_handler`` whose adversarial partition mounts ``attack`` (model attacks only)."""
    bad = adversary_ids(NUM_CLIENTS, FRACTION, seed)

    def handler(msg: Message, ctx: Context) -> Message:
        reply = train_handler(msg, ctx)
        if attack not in ("random-9.5x", "scaled-20x") or \
                int(ctx.node_config["partition-id"]) not in bad:
            return reply
        glob = msg.content.array_records["arrays"].to_torch_state_dict()
        own = reply.content.array_records["arrays"].to_torch_state_dict()
        keys = _float_keys(glob)
        if attack == "scaled-20x":
            return _with_state(reply, {k: glob[k] - 20.0 * (own[k] - glob[k]) if k in keys
                                       else own[k] for k in own})
        rnd = msg.content.config_records["config"]["server-round"]
        assert isinstance(rnd, int)
        gen = torch.Generator().manual_seed(seed * 100_003 + rnd)
        noise = {k: torch.randn(glob[k].shape, generator=gen) for k in keys}
        g_norm = sum(float((glob[k].double() ** 2).sum()) for k in keys) ** 0.5
        n_norm = sum(float((noise[k].double() ** 2).sum()) for k in keys) ** 0.5
        scale = 9.5 * g_norm / n_norm
        return _with_state(reply, {k: glob[k] + scale * noise[k] if k in keys else own[k]
                                   for k in own})

    return handler


def run_config(data_dir: Path, out: Path, attack: str, bound: str, valuation: str, seed: int,
               rounds: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "dataset": "mnist", "data-dir": str(data_dir), "output-dir": str(out),
        "num-server-rounds": rounds, "clients-per-round": 4, "client-max-samples": 300,
        "test-max-samples": 1000, "alpha": 1.0, "imbalance-factor": 1.0, "seed": seed,
        "valuation": valuation, "max-norm-ratio": 10.0, "device": "cpu",
        "update-bound": "none" if bound == "off" else bound, "update-bound-multiple": 3.0}
    if attack in ("label-flip", "noise"):
        cfg.update({"adversary-fraction": FRACTION, "adversary-kind": attack})
    return cfg


def one_run(data_dir: Path, attack: str, bound: str, valuation: str, seed: int,
            rounds: int) -> dict[str, Any]:
    """Run one cell in a temporary output dir; returns its JSON line."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = run_config(data_dir, Path(tmp), attack, bound, valuation, seed, rounds)
        nodes = [{"partition-id": i, "num-partitions": NUM_CLIENTS} for i in range(NUM_CLIENTS)]
        started = time.perf_counter()
        run(InProcessGrid(attacker_handler(attack, seed), nodes, cfg), parse_run_config(cfg),
            Path(tmp))
        recs = read_rounds(tmp)
    bad = {str(i) for i in adversary_ids(NUM_CLIENTS, FRACTION, seed)} if attack != "clean" \
        else set()
    weight = [sum(w for c, w in (r.get("weights") or {}).items() if c in bad) for r in recs[1:]]
    return {"attack": attack, "bound": bound, "valuation": valuation, "seed": seed,
            "rounds": rounds, "final_accuracy": recs[-1]["test_accuracy"],
            "accuracy": [r["test_accuracy"] for r in recs],
            "attacker_weight_mean": float(np.mean(weight)) if weight else 0.0,
            "rejected": sum(len(r.get("rejected") or {}) for r in recs[1:]),
            "clipped": sum(len(r.get("clipped") or {}) for r in recs[1:]),
            "seconds": round(time.perf_counter() - started, 1)}


def long_tail_norms(data_dir: Path, draws: int = 3) -> list[dict[str, Any]]:
    """First-round honest updates in the paper's long-tail split (MNIST, 100 clients, alpha
    0.1, imbalance 0.01): per draw of 10 clients, their examples and update norms, and what a
    3x lower-median bound on the raw norm and on the norm per example would reject."""
    from fedowen_strategy.defences.bounds import round_bound
    from fedowen_strategy.replies import record_to_state
    from fedowen_strategy.updates import update_norm
    from fedowen_task.models import build_model

    init = ArrayRecord(build_model("lenet", 1, 10, seed=0).state_dict())
    ref = record_to_state(init)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(draws):
        rows = []
        for pid in rng.choice(100, 10, replace=False):
            ctx = Context(run_id=1, node_id=1, state=RecordDict(),
                          node_config={"partition-id": int(pid), "num-partitions": 100},
                          run_config={"dataset": "mnist", "data-dir": str(data_dir)})
            msg = Message(RecordDict({"arrays": init, "config": ConfigRecord(
                {"server-round": 1})}), message_type=MessageType.TRAIN, dst_node_id=1)
            reply = train_handler(msg, ctx)
            n = reply.content.metric_records["metrics"][NUM_EXAMPLES_FIELD]
            assert isinstance(n, int)
            state = record_to_state(reply.content.array_records["arrays"])
            rows.append((n, update_norm(state, ref)))
        raw = round_bound([norm for _, norm in rows], 3.0) or 0.0
        per = round_bound([norm / n for n, norm in rows], 3.0) or 0.0
        out.append({"examples": [n for n, _ in rows], "norms": [round(v, 4) for _, v in rows],
                    "rejected_raw": sum(norm > raw for _, norm in rows),
                    "rejected_per_example": sum(norm > per * n for n, norm in rows)})
    return out


def _mean_std(values: list[float]) -> str:
    pct = [100 * v for v in values]
    std = statistics.stdev(pct) if len(pct) > 1 else float("nan")
    return f"{statistics.mean(pct):.1f} ± {std:.1f}"


def _table(lines: list[dict[str, Any]], value: Callable[[list[dict[str, Any]]], str]
           ) -> list[str]:
    """Markdown rows: one per attack, one column per (valuation, bound)."""
    cols = [(v, b) for v in VALUATIONS for b in BOUNDS]
    name = {"owen": "FedOwen", "none": "FedAvg"}
    rows = ["| attack | " + " | ".join(f"{name[v]} {b}" for v, b in cols) + " |",
            "|---|" + "---|" * len(cols)]
    for attack in ATTACKS:
        cells = [[r for r in lines if (r["attack"], r["valuation"], r["bound"]) ==
                  (attack, v, b)] for v, b in cols]
        rows.append(f"| {attack} | " + " | ".join(value(c) if c else "-" for c in cells) + " |")
    return rows


def _long_tail_note(out: Path) -> str:
    path = out / "long_tail_norms.json"
    if not path.exists():
        return ""
    draws = json.loads(path.read_text())
    raw = [d["rejected_raw"] for d in draws]
    per = [d["rejected_per_example"] for d in draws]
    return ("\n## Why per example\n\nHonest first-round updates in the paper's long-tail "
            "split (MNIST, 100 clients, alpha 0.1, imbalance 0.01; "
            f"{len(draws)} draws of 10 clients, `--long-tail`, `long_tail_norms.json`): a 3x "
            f"lower-median bound on the raw norm would reject {raw} honest clients per draw "
            f"(those with the most data), the bound per example {per}.\n")


def write_report(out: Path, lines: list[dict[str, Any]], command: str) -> None:
    """``final_accuracy.csv`` (one row per run) and ``README.md`` (mean ± std over seeds)."""
    with (out / "final_accuracy.csv").open("w") as fh:
        fh.write("attack,valuation,bound,seed,final_accuracy,attacker_weight_mean,rejected,"
                 "clipped\n")
        for r in lines:
            fh.write(f"{r['attack']},{r['valuation']},{r['bound']},{r['seed']},"
                     f"{r['final_accuracy']:.4f},{r['attacker_weight_mean']:.4f},"
                     f"{r['rejected']},{r['clipped']}\n")
    acc = _table(lines, lambda c: _mean_std([r["final_accuracy"] for r in c]))
    weight = _table(lines, lambda c: f"{statistics.mean(r['attacker_weight_mean'] for r in c):.3f}")
    rounds = sorted({r["rounds"] for r in lines})
    seeds = sorted({r["seed"] for r in lines})
    (out / "README.md").write_text(
        "# Attacks and robust update bounds\n\n"
        f"Produced by `{command}` (setup in benchmarks/bench_attacks.py): the real ServerApp "
        "and ClientApp over the in-process grid, MNIST, 6 clients of which 1 attacks, 4 per "
        f"round, {rounds} rounds, 300 examples per client, seeds {seeds}, device cpu. "
        "`off` = `update-bound = \"none\"` (only the old `max-norm-ratio = 10`); `clip` / "
        "`reject` = 3 x the round's lower-median update norm per example (every client holds "
        "300 examples here, so this is 3 x the lower-median norm).\n\n"
        "Final test accuracy (%, 1000 test images), mean ± std over seeds:\n\n"
        + "\n".join(acc) + "\n\nThe attacker's mean aggregation weight per round (0 when "
        "it was rejected or not selected):\n\n" + "\n".join(weight) + "\n"
        + _long_tail_note(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("docs/results/attack-bounds"))
    p.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=ATTACKS)
    p.add_argument("--long-tail", action="store_true",
                   help="only measure honest norms in the paper's long-tail split")
    args = p.parse_args(argv)
    with task_identity():
        return _sweep(args, argv)


def _sweep(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Run every missing (seed, attack, valuation, bound) cell, then write the report."""
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.long_tail:
        draws = long_tail_norms(args.data_dir.resolve())
        (args.out / "long_tail_norms.json").write_text(json.dumps(draws, indent=1) + "\n")
        print(json.dumps(draws))
        return 0
    log = args.out / "runs.jsonl"
    lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    done = {(r["attack"], r["bound"], r["valuation"], r["seed"], r["rounds"]) for r in lines}
    for seed in range(args.seeds):
        for attack in args.attacks:
            for valuation in VALUATIONS:
                for bound in BOUNDS:
                    if (attack, bound, valuation, seed, args.rounds) in done:
                        continue
                    line = one_run(args.data_dir.resolve(), attack, bound, valuation, seed,
                                   args.rounds)
                    print(json.dumps({k: v for k, v in line.items() if k != "accuracy"}),
                          flush=True)
                    with log.open("a") as fh:
                        fh.write(json.dumps(line) + "\n")
                    lines.append(line)
    command = "PYTHONPATH=. python benchmarks/bench_attacks.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    write_report(args.out, [r for r in lines if r["rounds"] == args.rounds], command.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
