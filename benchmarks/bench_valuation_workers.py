r"""Benchmark: the valuation's wall time and share of a round with its coalitions spread over
threads (``valuation-workers``), against one thread, on the app's own rounds (issue 48).

The app plays its rounds in this process (:func:`benchmarks.bench_round_share.play`: MNIST,
LeNet, the run config's defaults, ``owen-antithetic`` at M = 4 on the delta game, one torch
thread, CPU), keeping every game's inputs. Every round past ``--warmup`` is then valued again,
on the same inputs, through :func:`fedowen_strategy.round.contribution.value_round` with a fresh
utility of each worker count, ``--repeats`` times in rotating order. Per worker count:

* ``valuation s``: the median of the repeats' ``RoundValuation.seconds``; ``/ 1 worker``: its
  ratio to one worker's, measured on the same round in the same loop;
* ``share``: ``v / (round - v_app + v)``, the round as the app played it with its valuation
  ``v_app`` replaced by this one (the rest of an in-process round is the clients' training,
  which the workers do not touch);
* ``identical``: whether phi is bit-identical to one worker's (it must be).

``--backend flwr``: instead, one real ``flwr run`` per worker count (Ray, a SuperLink of this
process, ``--nodes`` virtual clients of one CPU each, ``valuation-workers`` set in the run
config); per round after the warm-up, the round's wall time (``elapsed_seconds``) and the
app's ``valuation_seconds`` from rounds.jsonl; ``identical`` compares the runs' phi round by
round (the runs are seeded alike). ``--cluster-nodes N`` runs them on a Ray cluster of N nodes
on this machine (:func:`sim.local_cluster.local_cluster`, ``--cpus-per-node`` each; the
SuperLink's ``RAY_ADDRESS`` attaches Flower's Ray backend to it, docs/deployment.md section 8):
the actors spread over the nodes, the ServerApp and its valuation stay on the head.

Example (the machine should be otherwise idle: the workers compete for its cores)::

    PYTHONPATH=. FEDOWEN_DATA=/work/shared/data python benchmarks/bench_valuation_workers.py \
        --clients 100 --nodes 1000 --workers 1 2 \
        --out-json docs/benchmarks/valuation_workers.json \
        --out-md docs/benchmarks/valuation_workers.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import load_average, machine_info, markdown_table, rotated, write_outputs
from benchmarks.bench_round_share import play, round_seconds
from fedowen_strategy.round.contribution import ValuationSettings, value_round
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_task.data import resolve_data_dir
from server_app.config import parse_run_config
from server_app.store.records import read_rounds


def measure(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """The app's rounds, then each measured round valued at every worker count."""
    run_config = {"dataset": "mnist", "model": "lenet", "clients-per-round": args.clients,
                  "num-server-rounds": args.warmup + args.rounds, "seed": args.seed,
                  "data-dir": str(args.data_dir), "device": "cpu", "torch-threads": 1,
                  "output-dir": str(work / "run")}
    started = time.perf_counter()
    app_factory, games, rounds = play(run_config, args.nodes)
    print(f"{args.clients} per round: the app's {len(rounds)} rounds took "
          f"{time.perf_counter() - started:.0f}s", flush=True)
    cfg = parse_run_config(run_config)
    settings = ValuationSettings(method=cfg.valuation, budget_m=cfg.budget_m, game=cfg.game,
                                 aggregation=cfg.choices().aggregation)
    factories = {w: CoalitionUtility(app_factory.model, app_factory.x_eval, app_factory.y_eval,
                                     metric=cfg.utility_metric, device="cpu", workers=w)
                 for w in args.workers}
    seconds = round_seconds(rounds, read_rounds(run_config["output-dir"]))
    rows: list[dict[str, Any]] = []
    for game, rec in zip(games, rounds, strict=True):
        if rec["round"] <= args.warmup:
            continue
        times: dict[int, list[float]] = {w: [] for w in args.workers}
        phi: dict[int, np.ndarray] = {}
        for r in range(args.repeats):
            for label in rotated([str(w) for w in args.workers], r + rec["round"]):
                w = int(label)
                val = value_round(game.states, game.num_examples, game.global_state, settings,
                                  factories[w], np.random.default_rng([args.seed, rec["round"]]))
                times[w].append(val.seconds)
                phi.setdefault(w, val.phi_raw)
        v_app, r_s = float(rec["valuation_seconds"]), seconds[rec["round"]]
        one = statistics.median(times[min(args.workers)])
        for w in args.workers:
            v = statistics.median(times[w])
            rows.append({"round": rec["round"], "n": len(game.states), "workers": w,
                         "seconds": v, "over_one": v / one,
                         "share": v / (r_s - v_app + v), "round_s": r_s, "app_valuation_s": v_app,
                         "identical": bool(np.array_equal(phi[w], phi[min(args.workers)])),
                         "samples": times[w]})
        print(f"  round {rec['round']}: n={len(game.states)}, round {r_s:.1f}s (valuation "
              f"{v_app:.1f}s); " + ", ".join(f"{w} workers {statistics.median(times[w]):.2f}s"
                                           for w in args.workers)
              + f"; load {load_average()[0]:.1f}", flush=True)
    return rows


def flwr_rounds(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """One real ``flwr run`` per worker count; each measured round's share."""
    from sim.local_cluster import local_cluster

    if args.cluster_nodes:
        with local_cluster(nodes=args.cluster_nodes, cpus_per_node=args.cpus_per_node) as info:
            return _flwr_rounds(args, work, {"RAY_ADDRESS": info["address"]})
    return _flwr_rounds(args, work, {})


def _flwr_rounds(args: argparse.Namespace, work: Path, env: dict[str, str]
                 ) -> list[dict[str, Any]]:
    from fedowen_deploy.launcher import LocalSuperLink, flwr_run

    phi: dict[int, dict[int, Any]] = {}
    rows: list[dict[str, Any]] = []
    for w in args.workers:
        out = work / f"flwr-{w}"
        config = {"dataset": "mnist", "model": "lenet", "clients-per-round": args.clients,
                  "num-server-rounds": args.warmup + args.rounds, "seed": args.seed,
                  "data-dir": str(args.data_dir), "device": "cpu", "torch-threads": 1,
                  "valuation-workers": w, "output-dir": str(out)}
        started = time.perf_counter()
        with LocalSuperLink(work / f"home-{w}", env=env) as link:
            outcome = flwr_run(link, config, num_supernodes=args.nodes, cpus_per_client=1.0,
                               timeout=args.timeout)
        if not outcome.ok:
            tail = "\n".join(outcome.output.splitlines()[-30:])
            raise RuntimeError(f"flwr run {outcome.run_id} ended {outcome.status}:\n{tail}")
        all_rounds = read_rounds(out)
        valued = [r for r in all_rounds if r.get("valuation_seconds") is not None]
        seconds = round_seconds(valued, all_rounds)
        phi[w] = {r["round"]: r.get("phi_raw") for r in valued}
        for r in valued:
            if r["round"] <= args.warmup:
                continue
            v, r_s = float(r["valuation_seconds"]), seconds[r["round"]]
            rows.append({"round": r["round"], "n": len(r.get("phi_raw") or {}), "workers": w,
                         "seconds": v, "share": v / r_s, "round_s": r_s, "app_valuation_s": v})
        print(f"  flwr run, {w} workers: {time.perf_counter() - started:.0f}s; "
              + ", ".join(f"round {x['round']} {x['round_s']:.1f}s (valuation "
                          f"{x['seconds']:.1f}s)" for x in rows if x["workers"] == w)
              + f"; load {load_average()[0]:.1f}", flush=True)
    one = min(args.workers)
    for row in rows:
        base = next(x for x in rows if x["workers"] == one and x["round"] == row["round"])
        row["over_one"] = row["seconds"] / base["seconds"]
        row["identical"] = phi[row["workers"]][row["round"]] == phi[one][row["round"]]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Medians over the measured rounds, per worker count."""
    out = []
    for w in sorted({r["workers"] for r in rows}):
        mine = [r for r in rows if r["workers"] == w]
        out.append([w, f"{statistics.median(r['n'] for r in mine):.0f}",
                    f"{statistics.median(r['seconds'] for r in mine):.2f}",
                    f"{statistics.median(r['over_one'] for r in mine):.2f}",
                    f"{100 * statistics.median(r['share'] for r in mine):.0f}%",
                    "yes" if all(r["identical"] for r in mine) else "NO"])
    return markdown_table(["workers", "players", "valuation s", "/ 1 worker", "share of round",
                           "phi identical"], out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=100, help="clients per round")
    p.add_argument("--nodes", type=int, default=1000, help="clients in the federation")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--warmup", type=int, default=1, help="rounds played before measuring")
    p.add_argument("--rounds", type=int, default=2, help="rounds measured after the warm-up")
    p.add_argument("--repeats", type=int, default=3, help="valuations per round and count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("inprocess", "flwr"), default="inprocess")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per flwr run")
    p.add_argument("--cluster-nodes", type=int, default=0,
                   help="with --backend flwr: a local Ray cluster of this many nodes (0: none)")
    p.add_argument("--cpus-per-node", type=float, default=1.0)
    p.add_argument("--data-dir", default=None, help="default: $FEDOWEN_DATA or ../shared/data")
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    args = p.parse_args(argv)
    if min(args.workers) != 1:
        p.error("--workers must include 1 (the baseline every ratio is against)")
    args.data_dir = resolve_data_dir(args.data_dir)
    before = machine_info()
    with tempfile.TemporaryDirectory() as tmp:
        rows = (flwr_rounds if args.backend == "flwr" else measure)(args, Path(tmp))
    md = table(rows)
    write_outputs({"machine": before, "load_after": load_average(), "args": vars(args) | {
        "data_dir": str(args.data_dir)}, "rows": rows}, md, args.out_json, args.out_md)


if __name__ == "__main__":
    main()
