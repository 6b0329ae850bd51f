r"""Benchmark: the valuation's share of a round at 10 and 100 clients per round, by estimator.

Issue 27, point 4. For each setting (clients per round of a federation) the app plays its own
rounds in this process: :func:`server_app.app.run` over :class:`sim.inline_grid.InProcessGrid`
served by the real ClientApp (MNIST, LeNet, the run config's defaults: ``owen`` at M = 4 on
the delta game with neg-loss, one torch thread, CPU), with its utility factory wrapped to keep
the inputs of every game it values (the global model, the updates after norm cap and links,
their example counts). The rounds' seconds and the app's own valuation seconds come from the
run's ``rounds.jsonl``.

After the run, every round past ``--warmup`` is valued again, on the same inputs, by each
estimator of :data:`ESTIMATORS` through :func:`fedowen_strategy.round.contribution.value_round` (the
app's path: a fresh utility per call, so nothing is cached across estimators), in an order
rotated per round. For each:

* ``valuation s``: ``RoundValuation.seconds`` (building the utility, nu(empty), nu(N), the
  estimator), and its ratio to ``owen`` M = 4 (the app's default, "before") timed on the same
  round in the same loop;
* ``share``: ``v / (round - v_app + v)``, the round as the app played it with its valuation
  ``v_app`` replaced by this one;
* ``Spearman``: of the raw values against exact Shapley values (all 2^n coalitions) where the
  round has at most ``EXACT_MAX_N`` players, else against ``owen-antithetic`` at
  ``--ref-m`` (the high-budget reference, untimed); there ``--ref-check`` values the round
  once more with the reference at another seed (row ``reference, another seed``): its
  Spearman is the ceiling the reference's own noise leaves.

``--profile``: one ``owen`` M = 4 valuation of the first measured round at the largest setting
under cProfile, split into building the utility, forming coalition parameters
(:func:`~fedowen_strategy.torch_utility.coalitions.delta_params`), forwards and scores, and
the rest (the estimator's bookkeeping). Example::

    PYTHONPATH=. FEDOWEN_DATA=/work/shared/data python benchmarks/bench_round_share.py \
        --warmup 2 --rounds 3 \
        --out-json docs/benchmarks/round_share.json --out-md docs/benchmarks/round_share.md

Measured on this project's 2-core machine beside another experiment: 14 minutes (the
n = 100 reference and its check, 2 x 1600 evaluations a round, take most of it).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

import server_app.app as server_app
import server_app.factory as server_factory
from benchmarks._common import load_average, machine_info, markdown_table, rotated, write_outputs
from benchmarks.bench_ranking_battery import spearman, weights_error
from client_app.app import app as client_app
from fedowen_strategy.round.contribution import ValuationSettings, value_round
from fedowen_strategy.round.round_valuers import RoundValuation
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_task.data import resolve_data_dir
from server_app.config import RunConfig, parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid, task_identity

BEFORE = "owen M=4"
#: (label, method, budget-m, estimator parameters)
ESTIMATORS: tuple[tuple[str, str, int, dict[str, Any]], ...] = (
    (BEFORE, "owen", 4, {}),
    ("owen-antithetic M=2", "owen-antithetic", 2, {}),
    ("owen-antithetic M=4", "owen-antithetic", 4, {}),
    ("first-order at=0.5", "first-order", 1, {"at": 0.5}),
    ("first-order-refined M=1", "first-order-refined", 1, {}),
    ("first-order-refined M=4", "first-order-refined", 4, {}),
)
EXACT_MAX_N = 12
REF_CHECK = "reference, another seed"


@dataclass(frozen=True)
class Captured:
    """The inputs of one game the app valued (after norm cap and links)."""

    global_state: dict[str, np.ndarray]
    states: list[dict[str, np.ndarray]]
    num_examples: list[int]


def play(run_config: dict[str, Any], num_nodes: int
         ) -> tuple[CoalitionUtility, list[Captured], list[dict[str, Any]]]:
    """Run the app in this process; its utility factory, the games it valued, its rounds."""
    captured: list[Captured] = []
    factories: list[CoalitionUtility] = []
    recording = [True]  # off once the app's run is over

    class Capturing(CoalitionUtility):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            factories.append(self)

        def __call__(self, global_state: Any, client_states: Any, num_examples: Any,
                     shares: Any = None) -> Any:
            if recording[0]:
                captured.append(Captured(
                    {k: np.array(v) for k, v in global_state.items()},
                    [{k: np.array(v) for k, v in s.items()} for s in client_states],
                    [int(m) for m in num_examples]))
            return super().__call__(global_state, client_states, num_examples, shares=shares)

    cfg = parse_run_config(run_config)
    nodes = [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]
    with task_identity(), mock.patch.object(server_factory, "CoalitionUtility", Capturing):
        server_app.run(InProcessGrid(client_app, nodes, run_config), cfg,
                       Path(run_config["output-dir"]))
    recording[0] = False
    rounds = [r for r in read_rounds(run_config["output-dir"]) if r.get("returned")]
    if len(captured) != len(rounds) or len(factories) != 1:
        raise RuntimeError(f"{len(captured)} games captured for {len(rounds)} valued rounds "
                           f"({len(factories)} factories): the app's path changed")
    return factories[0], captured, rounds


def value(game: Captured, cfg: RunConfig, method: str, budget_m: int, params: dict[str, Any],
          factory: CoalitionUtility, seed: list[int]) -> RoundValuation:
    """The round valued as the app values it, with another estimator and budget."""
    settings = ValuationSettings(method=method, budget_m=budget_m, params=params,
                                 game=cfg.game, aggregation=cfg.choices().aggregation)
    return value_round(game.states, game.num_examples, game.global_state, settings, factory,
                       np.random.default_rng(seed))


def round_seconds(rounds: list[dict[str, Any]], all_rounds: list[dict[str, Any]]
                  ) -> dict[int, float]:
    """Seconds of each round, from the records' ``elapsed_seconds`` (round 0: the start)."""
    elapsed = {r["round"]: float(r["elapsed_seconds"]) for r in all_rounds
               if "elapsed_seconds" in r}
    return {r["round"]: elapsed[r["round"]] - elapsed.get(r["round"] - 1, 0.0) for r in rounds}


def measure(clients: int, nodes: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One setting: the app's run, then every measured round valued by every estimator."""
    run_config = {"dataset": "mnist", "model": "lenet", "clients-per-round": clients,
                  "num-server-rounds": args.warmup + args.rounds, "seed": args.seed,
                  "data-dir": str(args.data_dir), "device": "cpu", "torch-threads": 1,
                  "output-dir": str(work / f"run-{clients}")}
    started = time.perf_counter()
    factory, games, rounds = play(run_config, nodes)
    print(f"{clients} per round: the app's {len(rounds)} rounds took "
          f"{time.perf_counter() - started:.0f}s", flush=True)
    cfg = parse_run_config(run_config)
    seconds = round_seconds(rounds, read_rounds(run_config["output-dir"]))
    rows: list[dict[str, Any]] = []
    for k, (game, rec) in enumerate(zip(games, rounds, strict=True)):
        if rec["round"] <= args.warmup:
            continue
        n = len(game.states)
        ref_label = "exact" if n <= EXACT_MAX_N else f"owen-antithetic M={args.ref_m}"
        ref_method, ref_m = ("exact", 1) if n <= EXACT_MAX_N else ("owen-antithetic",
                                                                   args.ref_m)
        ref = value(game, cfg, ref_method, ref_m, {}, factory, [args.seed, rec["round"], 99])
        labels = rotated([e[0] for e in ESTIMATORS], k)
        got = {}
        for label in labels:
            _, method, m, params = next(e for e in ESTIMATORS if e[0] == label)
            got[label] = value(game, cfg, method, m, params, factory,
                               [args.seed, rec["round"], labels.index(label)])
        if n > EXACT_MAX_N and args.ref_check:  # the reference's own noise: a ceiling
            got[REF_CHECK] = value(game, cfg, "owen-antithetic", args.ref_m, {}, factory,
                                   [args.seed, rec["round"], 98])
        v_app, r_s = float(rec["valuation_seconds"]), seconds[rec["round"]]
        for label, val in got.items():
            rows.append({
                "clients_per_round": clients, "round": rec["round"], "n": n,
                "estimator": label, "n_evals": val.n_evals, "seconds": val.seconds,
                "over_before": val.seconds / got[BEFORE].seconds,
                "share": val.seconds / (r_s - v_app + val.seconds),
                "spearman": spearman(val.phi_raw, ref.phi_raw), "reference": ref_label,
                "weights_tv": weights_error(val.phi_raw, ref.phi_raw),
                "round_s": r_s, "app_valuation_s": v_app, "reference_s": ref.seconds})
        print(f"  round {rec['round']}: n={n}, round {r_s:.1f}s (valuation {v_app:.1f}s); "
              + ", ".join(f"{lab} {v.seconds:.1f}s rho={spearman(v.phi_raw, ref.phi_raw):.3f}"
                          for lab, v in got.items()) + f"; load {load_average()[0]:.1f}",
              flush=True)
    out: dict[str, Any] = {"clients_per_round": clients, "nodes": nodes, "rows": rows,
                           "app_rounds": [{k: r.get(k) for k in ("round", "n_evals",
                                                                  "valuation_seconds")}
                                          for r in rounds]}
    measured = [(float(r["valuation_seconds"]), seconds[r["round"]]) for r in rounds
                if r["round"] > args.warmup]
    out["app"] = {"valuation_s": statistics.median(v for v, _ in measured),
                  "round_s": statistics.median(t for _, t in measured),
                  "share": statistics.median(v / t for v, t in measured)}
    if args.profile and clients == max(args.clients):
        first = next(g for g, r in zip(games, rounds, strict=True) if r["round"] > args.warmup)
        out["profile"] = profile(first, cfg, factory, args.seed)
    return out


#: (part, the functions whose cumulative time it is)
PARTS = (("build the utility (stack states, chunk rule)", ("__init__",), "batched.py"),
         ("coalition parameters (delta_params)", ("delta_params",), "coalitions.py"),
         ("forwards and scores (_sums_loop)", ("_sums_loop",), "batched.py"))


def profile(game: Captured, cfg: RunConfig, factory: CoalitionUtility, seed: int
            ) -> dict[str, Any]:
    """Where one ``owen`` M = 4 valuation's time goes (cProfile, cumulative seconds)."""
    prof = cProfile.Profile()
    prof.enable()
    val = value(game, cfg, "owen", 4, {}, factory, [seed, 0, 7])
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(t for (_, _, name), (_, _, _, t, _) in stats.items() if name == "value_round")
    parts = {}
    for label, names, file in PARTS:
        parts[label] = sum(ct for (path, _, name), (_, _, _, ct, _) in stats.items()
                           if name in names and path.endswith(file))
    parts["the rest (estimator, coefficients, copies)"] = total - sum(parts.values())
    return {"n": len(game.states), "n_evals": val.n_evals, "seconds_profiled": total,
            "seconds_unprofiled": val.seconds, "parts_s": parts}


def summary(settings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (clients per round, estimator): medians over rounds, mean Spearman."""
    out = []
    for s in settings:
        present = {r["estimator"] for r in s["rows"]}
        for label in [lab for lab in [*(e[0] for e in ESTIMATORS), REF_CHECK]
                      if lab in present]:
            rs = [r for r in s["rows"] if r["estimator"] == label]
            out.append({"clients_per_round": s["clients_per_round"], "estimator": label,
                        "rounds": len(rs), "n": statistics.median(r["n"] for r in rs),
                        "n_evals": statistics.median(r["n_evals"] for r in rs),
                        "seconds": statistics.median(r["seconds"] for r in rs),
                        "over_before": statistics.median(r["over_before"] for r in rs),
                        "share": statistics.median(r["share"] for r in rs),
                        "spearman": statistics.fmean(r["spearman"] for r in rs),
                        "spearman_min": min(r["spearman"] for r in rs),
                        "weights_tv": statistics.fmean(r.get("weights_tv", float("nan"))
                                                       for r in rs),
                        "reference": rs[0]["reference"]})
    return out


def tables(rows: list[dict[str, Any]], settings: list[dict[str, Any]],
           machine: dict[str, Any]) -> str:
    """Markdown: how it was made, the summary, the app's own rounds, the profile."""
    text = (f"# Valuation share of a round (issue 27)\n\nMade by `PYTHONPATH=. "
            f"{machine['command']}` (started "
            f"{machine['started']}; see the script's docstring). Machine: {machine['platform']}, "
            f"{machine['cpu_count']} cores, torch {machine['torch']} on one thread, Flower "
            f"{machine['flwr']}; load average {machine['load_avg_start'][0]:.1f} at the start "
            f"and {machine['load_avg_end'][0]:.1f} at the end (a concurrent experiment used "
            "the cores: absolute seconds are inflated, ratios within a round less so). "
            "Medians over the measured rounds; `/ before`: seconds over `owen` M = 4 "
            "timed on the same round; `share of round`: the round as played with its "
            "valuation replaced by this one.\n\n")
    text += markdown_table(
        ["clients / round", "estimator", "players n", "evaluations", "valuation s",
         "/ before", "share of round", "Spearman mean (min)", "weights tv", "against"],
        [[r["clients_per_round"], r["estimator"], f"{r['n']:g}", f"{r['n_evals']:g}",
          f"{r['seconds']:.2f}", f"{r['over_before']:.3f}", f"{r['share']:.0%}",
          f"{r['spearman']:.4f} ({r['spearman_min']:.4f})", f"{r['weights_tv']:.4f}",
          r["reference"]] for r in rows])
    text += "\nAs the app played them (its own `owen` M = 4, medians over the measured rounds):\n\n"
    text += markdown_table(["clients / round", "round s", "valuation s", "share of round"],
                           [[s["clients_per_round"], f"{s['app']['round_s']:.1f}",
                             f"{s['app']['valuation_s']:.1f}", f"{s['app']['share']:.0%}"]
                            for s in settings])
    for s in settings:
        if "profile" in s:
            p = s["profile"]
            total = sum(p["parts_s"].values())
            text += (f"\nProfile of one `owen` M = 4 valuation at {s['clients_per_round']} "
                     f"clients per round (n = {p['n']}, {p['n_evals']} evaluations; "
                     f"{p['seconds_unprofiled']:.1f} s unprofiled, {total:.1f} s under "
                     "cProfile):\n\n")
            text += markdown_table(["part", "seconds", "share"],
                                   [[k, f"{v:.2f}", f"{v / total:.0%}"]
                                    for k, v in p["parts_s"].items()])
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    p.add_argument("--nodes", type=int, nargs="+", default=[100, 1000],
                   help="virtual clients of the federation, one per --clients")
    p.add_argument("--warmup", type=int, default=1, help="rounds played before measuring")
    p.add_argument("--rounds", type=int, default=2, help="rounds measured after the warm-up")
    p.add_argument("--ref-m", type=int, default=20,
                   help="budget-m of the owen-antithetic reference where exact is too dear")
    p.add_argument("--ref-check", action=argparse.BooleanOptionalAction, default=True,
                   help="value each round again with the reference at another seed")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="default: $FEDOWEN_DATA or ../shared/data")
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    p.add_argument("--from-json", default=None,
                   help="re-render --out-md from an earlier --out-json instead of running")
    args = p.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        write_outputs(saved, tables(saved["summary"], saved["settings"], saved["machine"]),
                      None, args.out_md)
        return
    if len(args.nodes) != len(args.clients):
        p.error(f"--nodes needs one value per --clients ({len(args.clients)}), got {args.nodes}")
    args.data_dir = resolve_data_dir(args.data_dir)
    torch.set_num_threads(1)
    machine = machine_info()
    print(machine, flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-round-share-") as tmp:
        settings = [measure(c, k, args, Path(tmp)) for c, k in
                    zip(args.clients, args.nodes, strict=True)]
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    rows = summary(settings)
    write_outputs({"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
                   "summary": rows, "settings": settings}, tables(rows, settings, machine),
                  args.out_json, args.out_md)


if __name__ == "__main__":
    main()
