r"""Benchmark: a Flower + Ray round vs the same round run in-process, same config, same run.

Two ways to run the same ``--rounds`` FedOwen rounds (MNIST, ``--supernodes`` virtual clients,
``--clients-per-round`` per round, valuation ``--valuation``):

* ``flower``: a real ``flwr run`` (:func:`fedowen_deploy.launcher.flwr_run`) on a SuperLink of
  our own,
  simulation engine with Ray, ``client-resources-num-cpus=1`` (2 actors on 2 cores);
* ``inprocess``: :func:`server_app.app.run` over :class:`sim.inline_grid.InProcessGrid`, which
  calls the real ClientApp ``train_handler`` one client after the other in one process.

Seconds per round come from ``rounds.jsonl`` (``elapsed_seconds`` differences, measured by the
ServerApp from just before the strategy starts): round 1 (Ray starts its actors, each actor
loads the data) is reported apart from the steady rounds 2..K (median). The fixed overhead is
the caller's wall time minus the last ``elapsed_seconds``: for ``flower`` the SuperLink's start,
``flwr run`` submission, the ServerApp process start, data loading and the final status poll;
for ``inprocess`` data loading and model building only. Each in-process run is a fresh
process (``spawn``) with ``--threads`` torch threads, so data caches do not carry over;
``OMP_NUM_THREADS=--threads`` reaches the SuperLink's ServerApp (Ray sets 1 in its actors).
Repeats alternate the order. Example::

    PYTHONPATH=. python benchmarks/bench_flower_overhead.py \
        --out-json docs/benchmarks/flower_overhead.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    load_average,
    machine_info,
    markdown_table,
    rotated,
    summarise,
    write_outputs,
)
from fedowen_deploy.launcher import LocalSuperLink, flwr_run
from fedowen_task.data import resolve_data_dir


def run_config(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The run-config overrides both ways share (only the output dir differs)."""
    return {"num-server-rounds": args.rounds, "clients-per-round": args.clients_per_round,
            "dataset": "mnist", "data-dir": str(args.data_dir), "output-dir": str(out),
            "valuation": args.valuation, "client-max-samples": args.client_max_samples,
            "test-max-samples": args.test_max_samples, "seed": args.seed}


def round_times(out: Path) -> dict[str, Any]:
    """Per-round seconds, round-1 seconds, steady median and valuation seconds of a run."""
    from server_app.store.records import read_rounds

    rounds = read_rounds(out)
    elapsed = [float(r["elapsed_seconds"]) for r in rounds]
    per_round = [b - a for a, b in itertools.pairwise(elapsed)]
    if not per_round:
        raise RuntimeError(f"{out}/rounds.jsonl has {len(rounds)} records; the run failed")
    steady = per_round[1:] or per_round
    return {"per_round_s": per_round, "round1_s": per_round[0],
            "steady_s": statistics.median(steady), "strategy_s": elapsed[-1],
            "valuation_s": [r.get("valuation_seconds") for r in rounds[1:]],
            "n_evals": [r.get("n_evals") for r in rounds[1:]]}


def flower_job(args: argparse.Namespace, work: Path, sampler_roots: list[int] | None = None
               ) -> dict[str, Any]:
    """One ``flwr run`` on a fresh SuperLink; ``sampler_roots`` receives its pid if given."""
    out = work / f"flower-{time.time_ns()}"
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the SuperLink passes it on
    start = time.perf_counter()
    with LocalSuperLink(work / f"flwr-home-{time.time_ns()}") as link:
        linked = time.perf_counter()
        if sampler_roots is not None and link.process is not None:
            sampler_roots.append(link.process.pid)
        outcome = flwr_run(link, run_config(args, out), num_supernodes=args.supernodes,
                           cpus_per_client=1.0, timeout=args.timeout)
    wall = time.perf_counter() - start
    if not outcome.ok:
        tail = "\n".join(outcome.output.splitlines()[-30:])
        raise RuntimeError(f"flwr run {outcome.run_id} ended {outcome.status}; output:\n{tail}")
    times = round_times(out)
    return {**times, "wall_s": wall, "superlink_start_s": linked - start,
            "fixed_s": wall - times["strategy_s"], "run_id": outcome.run_id, "out": str(out)}


def _inprocess_child(cfg: dict[str, Any], supernodes: int, threads: int) -> None:
    import torch
    from flwr.supercore.task_identity import TaskIdentity

    from client_app.app import app as client_app
    from server_app.app import run
    from server_app.config import parse_run_config
    from sim.inline_grid import InProcessGrid

    torch.set_num_threads(threads)
    # Messages built outside a running app need a task identity (internal API, as in the tests).
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    nodes = [{"partition-id": i, "num-partitions": supernodes} for i in range(supernodes)]
    run(InProcessGrid(client_app, nodes, cfg), parse_run_config(cfg), Path(cfg["output-dir"]))


def inprocess_job(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The same rounds over the in-process grid, in a fresh spawned process."""
    out = work / f"inprocess-{time.time_ns()}"
    proc = mp.get_context("spawn").Process(
        target=_inprocess_child, args=(run_config(args, out), args.supernodes, args.threads))
    start = time.perf_counter()
    proc.start()
    proc.join(args.timeout)
    wall = time.perf_counter() - start
    if proc.exitcode != 0:
        raise RuntimeError(f"in-process run exited with {proc.exitcode}; see {out}")
    times = round_times(out)
    return {**times, "wall_s": wall, "fixed_s": wall - times["strategy_s"], "out": str(out)}


def summarise_runs(runs: dict[str, list[dict[str, Any]]], how: str) -> list[dict[str, Any]]:
    """One row per way; steady and round-1 ratios against in-process."""
    rows = []
    for way in ("inprocess", "flower"):
        rs = runs[way]
        rest = [statistics.median(t - (v or 0.0) for t, v in list(
            zip(r["per_round_s"], r["valuation_s"], strict=True))[1:]) for r in rs]
        rows.append({"way": way, "steady_s": summarise([r["steady_s"] for r in rs], how),
                     "round1_s": summarise([r["round1_s"] for r in rs], how),
                     "fixed_s": summarise([r["fixed_s"] for r in rs], how),
                     "wall_s": summarise([r["wall_s"] for r in rs], how),
                     "rest_s": summarise(rest, how),
                     "valuation_s": statistics.median(
                         v for r in rs for v in r["valuation_s"] if v is not None)})
    base = rows[0]
    for row in rows:
        row["steady_ratio"] = row["steady_s"] / base["steady_s"]
        row["round1_ratio"] = row["round1_s"] / base["round1_s"]
        row["rest_ratio"] = row["rest_s"] / base["rest_s"]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: in-process and Flower side by side."""
    head = ["way", "s / round (rounds 2..K)", "ratio", "of which valuation s",
            "round minus valuation s", "ratio", "round 1 s", "ratio", "fixed overhead s",
            "wall s"]
    body = [[r["way"], f"{r['steady_s']:.2f}", f"{r['steady_ratio']:.2f}",
             f"{r['valuation_s']:.2f}", f"{r['rest_s']:.2f}", f"{r['rest_ratio']:.2f}",
             f"{r['round1_s']:.2f}", f"{r['round1_ratio']:.2f}", f"{r['fixed_s']:.1f}",
             f"{r['wall_s']:.1f}"] for r in rows]
    return markdown_table(head, body)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--supernodes", type=int, default=100)
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument("--valuation", default="owen")
    p.add_argument("--client-max-samples", type=int, default=600)
    p.add_argument("--test-max-samples", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1, help="torch threads outside Ray actors")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--summary", choices=["min", "median"], default="min")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    p.add_argument("--from-json", default=None, help="re-tabulate a saved run, run nothing")
    args = p.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        rows = summarise_runs(saved["runs"], saved["args"]["summary"])
        write_outputs({**saved, "rows": rows}, table(rows), args.out_json, args.out_md)
        return
    if args.rounds < 2 or args.repeats < 1:
        p.error("--rounds must be >= 2 (round 1 is reported apart) and --repeats >= 1")
    args.data_dir = resolve_data_dir(args.data_dir)
    machine = machine_info()
    print(machine, flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"inprocess": [], "flower": []}
    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        for rep in range(args.repeats):
            for way in rotated(["inprocess", "flower"], rep):
                res = (flower_job if way == "flower" else inprocess_job)(args, Path(tmp))
                runs[way].append(res)
                print(f"repeat {rep + 1} {way}: steady {res['steady_s']:.2f} s/round, round 1 "
                      f"{res['round1_s']:.2f} s, fixed {res['fixed_s']:.1f} s, load "
                      f"{load_average()[0]:.1f}", flush=True)
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    rows = summarise_runs(runs, args.summary)
    payload = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
               "rows": rows, "runs": runs}
    write_outputs(payload, table(rows), args.out_json, args.out_md)


if __name__ == "__main__":
    main()
