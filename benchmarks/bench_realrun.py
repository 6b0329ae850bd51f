r"""Benchmark: valuation seconds inside a real ``flwr run`` and the inline backend vs in-process.

In ONE run of this script, for the same config (MNIST, LeNet, ``--clients`` virtual clients,
all of them each round, ``--valuation`` at budget n x M, ``--rounds`` rounds):

* ``flwr``: a real ``flwr run`` (:func:`fedowen_deploy.launcher.flwr_run` on a SuperLink of our own,
  Ray, ``client-resources-num-cpus=1``); ``valuation_seconds`` per round from rounds.jsonl;
* ``inline``: the inline backend (:func:`sim.inline.inline_run`: one child process, the real
  ServerApp and ClientApp over the in-process grid), read the same way;
* ``inprocess``: the server's own valuation call, :func:`fedowen_strategy.round.contribution.
  value_round` with the ServerApp's :class:`CoalitionUtility` on the same evaluation set (the
  run config's ``eval-fraction`` of MNIST's training split), one factory for ``--rounds``
  calls as in a run, in a fresh process (its own session) with ``--threads`` torch threads;
  client states are the seeded model plus noise (a forward's cost does not depend on them).

Valuation time is divided by the round's coalition evaluations (``n_evals``), so the ways
are compared per evaluation even where the estimator's sampling drew a different number of
distinct coalitions. Round 1 (which also prepares the network) is reported apart from the
later rounds. ``--flwr-threads 0`` adds a ``flwr`` run with torch's default thread count in
the ServerApp, to see what the ``torch-threads`` setting is worth. The in-process measurement
is repeated before, between and after the runs, and each run is divided by the mean of the
in-process figures taken just before and after it, so drifting background load hits both
sides of a ratio alike. Example::

    PYTHONPATH=. python benchmarks/bench_realrun.py --out-json docs/benchmarks/realrun.json \
        --out-md docs/benchmarks/realrun.md
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._common import load_average, machine_info, markdown_table, write_outputs
from fedowen_deploy.launcher import LocalSuperLink, flwr_run
from fedowen_strategy.round.contribution import value_round
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_strategy.torch_utility.batched import resolve_device
from fedowen_task.data import load_dataset, resolve_data_dir
from fedowen_task.models import build_model, state_to_numpy
from server_app.config import parse_run_config
from server_app.evaluation import server_sets
from server_app.factory import build_strategy
from server_app.store.records import read_rounds
from sim.inline import inline_run


def run_config(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The run config the three ways share (only the output dir differs)."""
    return {"dataset": "mnist", "data-dir": str(args.data_dir), "output-dir": str(out),
            "num-server-rounds": args.rounds, "clients-per-round": args.clients,
            "valuation": args.valuation, "seed": args.seed, "torch-threads": args.threads,
            "client-max-samples": args.client_max_samples,
            "test-max-samples": args.test_max_samples}


def per_round(out: Path) -> list[dict[str, float]]:
    """valuation_seconds and n_evals of every valued round in ``out``/rounds.jsonl."""
    rows = [r for r in read_rounds(out) if r.get("valuation_seconds") is not None]
    if not rows:
        raise RuntimeError(f"{out}/rounds.jsonl has no valued round; the run failed")
    return [{"seconds": float(r["valuation_seconds"]), "n_evals": int(r["n_evals"])}
            for r in rows]


def flwr_job(args: argparse.Namespace, work: Path) -> list[dict[str, float]]:
    """A real ``flwr run`` on a fresh SuperLink; its rounds."""
    out = work / f"flwr-{time.time_ns()}"
    with LocalSuperLink(work / f"flwr-home-{time.time_ns()}") as link:
        outcome = flwr_run(link, run_config(args, out), num_supernodes=args.clients,
                           cpus_per_client=1.0, timeout=args.timeout)
    if not outcome.ok:
        tail = "\n".join(outcome.output.splitlines()[-30:])
        raise RuntimeError(f"flwr run {outcome.run_id} ended {outcome.status}:\n{tail}")
    return per_round(out)


def inline_job(args: argparse.Namespace, work: Path) -> list[dict[str, float]]:
    """The inline backend (a child process, as the experiment runner starts it)."""
    out = work / f"inline-{time.time_ns()}"
    outcome = inline_run(None, run_config(args, out), num_supernodes=args.clients,
                         timeout=args.timeout)
    if not outcome.ok:
        raise RuntimeError(f"inline run ended {outcome.status}:\n{outcome.output[-3000:]}")
    return per_round(out)


def _inprocess_child(args: argparse.Namespace, queue: Any) -> None:
    """Time ``rounds`` valuation calls with one factory, as the ServerApp makes them; put the
    per-round results on ``queue``. Runs in its own session: with the kernel's autogroup
    scheduling (on here) CPU is shared per session, and the ``flwr`` and ``inline`` runs each
    have one of their own, so the in-process figure must not share this script's."""
    os.setsid()
    torch.set_num_threads(args.threads)
    cfg = parse_run_config(run_config(args, Path(tempfile.gettempdir())))
    ds = load_dataset(cfg.dataset, resolve_data_dir(str(args.data_dir)))
    sets = server_sets(cfg, ds)
    model = build_model(cfg.model_name(), ds.in_channels, ds.num_classes, seed=cfg.seed)
    rng = np.random.default_rng(args.seed)
    glob = state_to_numpy(model)
    states = [{k: (v + rng.normal(0, 0.05, v.shape)).astype(v.dtype) for k, v in glob.items()}
              for _ in range(args.clients)]
    sizes = rng.integers(50, 200, args.clients).tolist()
    factory = CoalitionUtility(model, sets[0], sets[1], metric=cfg.utility_metric,
                               device=resolve_device(cfg.torch_device()))
    settings = build_strategy(cfg, factory, None).valuation
    out = []
    for r in range(args.rounds):
        val = value_round(states, sizes, glob, settings, factory,
                          np.random.default_rng([args.seed, r]))
        out.append({"seconds": val.seconds, "n_evals": val.n_evals})
    queue.put({"rounds": out, "eval_images": len(sets[0])})


def inprocess_job(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`_inprocess_child` in a fresh spawned process; its result."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_inprocess_child, args=(args, queue))
    proc.start()
    result = queue.get(timeout=args.timeout)
    proc.join()
    return dict(result)


def per_eval(rounds: list[dict[str, float]]) -> tuple[float, float]:
    """(round 1, median of the later rounds) seconds per coalition evaluation."""
    rates = [r["seconds"] / max(r["n_evals"], 1) for r in rounds]
    return rates[0], statistics.median(rates[1:] or rates)


def summarise(runs: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per way: per-evaluation seconds and the ratio to the in-process figures
    measured right before and after it."""
    base = [per_eval(r["rounds"]) for r in runs["inprocess"]]
    rows: list[dict[str, Any]] = [{
        "way": "inprocess", "round1_ms": 1e3 * statistics.median(b[0] for b in base),
        "later_ms": 1e3 * statistics.median(b[1] for b in base), "ratio_round1": 1.0,
        "ratio_later": 1.0}]
    for i, way in enumerate(w for w in runs if w != "inprocess"):
        first, later = per_eval(runs[way])
        before, after = base[i], base[i + 1]
        rows.append({"way": way, "round1_ms": 1e3 * first, "later_ms": 1e3 * later,
                     "ratio_round1": first / ((before[0] + after[0]) / 2),
                     "ratio_later": later / ((before[1] + after[1]) / 2)})
    for row in rows:  # the in-process rounds shown are the first measurement's
        way = row["way"]
        row["rounds"] = runs[way][0]["rounds"] if way == "inprocess" else runs[way]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ["way", "ms / evaluation, round 1", "ratio", "ms / evaluation, rounds 2..K",
            "ratio", "valuation s per round (n_evals)"]
    body = [[r["way"], f"{r['round1_ms']:.1f}", f"{r['ratio_round1']:.2f}",
             f"{r['later_ms']:.1f}", f"{r['ratio_later']:.2f}",
             ", ".join(f"{x['seconds']:.2f} ({x['n_evals']})" for x in r["rounds"])]
            for r in rows]
    return markdown_table(head, body)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10, help="virtual clients, all per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--valuation", default="owen")
    p.add_argument("--client-max-samples", type=int, default=200)
    p.add_argument("--test-max-samples", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1, help="run config torch-threads")
    p.add_argument("--flwr-threads", type=int, nargs="*", default=[],
                   help="extra flwr runs with these torch-threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    args = p.parse_args(argv)
    if args.rounds < 2 or args.clients < 2:
        p.error("--rounds and --clients must be >= 2")
    args.data_dir = resolve_data_dir(args.data_dir)
    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(machine, flush=True)
    runs: dict[str, Any] = {"inprocess": [inprocess_job(args)]}
    ways = [("flwr", flwr_job, args.threads), ("inline", inline_job, args.threads)]
    ways += [(f"flwr, torch-threads={t}", flwr_job, t) for t in args.flwr_threads]
    with tempfile.TemporaryDirectory(prefix="bench-realrun-") as tmp:
        for way, job, threads in ways:
            runs[way] = job(argparse.Namespace(**{**vars(args), "threads": threads}), Path(tmp))
            runs["inprocess"].append(inprocess_job(args))
            print(f"{way}: {runs[way]}; in-process after: {runs['inprocess'][-1]}; load "
                  f"{load_average()[0]:.1f}", flush=True)
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    machine["eval_images"] = runs["inprocess"][0]["eval_images"]
    rows = summarise(runs)
    payload = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
               "rows": rows, "runs": runs}
    write_outputs(payload, table(rows), args.out_json, args.out_md)


if __name__ == "__main__":
    main()
