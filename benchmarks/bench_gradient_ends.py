r"""Benchmark (issue 71, deliver 1): the ends from the gradient passes, before/after in one run.

``first-order-simpson`` and ``first-order-refined`` take the first-order terms at t = 0 and
t = 1; those backward passes score the global model and the aggregate, which are the empty and
the grand coalition. Since this change the registry takes those terms before the ends, and the
torch utility keeps the two values, so ``nu(empty)`` and ``nu(N)`` cost no forward.

The app plays its own rounds in this process with ``--valuation`` (:func:`bench_round_share.play`
keeps every valued game's inputs). Every measured round is then valued again through the app's
path (:func:`~fedowen_strategy.round.contribution.value_round`, a fresh utility a call) in both
forms, ``--repeats`` times, alternating which goes first:

* ``after``: today's utility (the app's factory);
* ``before``: the same utility with the gradient passes' values dropped from its cache
  (:class:`ForwardEnds`), so the ends are forwarded, as on main at 8423f09.

Reported: ``RoundValuation.seconds`` (median over repeats) and its ratio, the forwards each ran
(``CoalitionGame.n_model_evals``), the largest difference of phi and of the ends between the two,
and the valuation's share ``v / (round - v_app + v)`` of the round as the app played it
(rounds.jsonl's ``round_seconds``).

    PYTHONPATH=. FEDOWEN_DATA=/work/shared/data python benchmarks/bench_gradient_ends.py \
        --dataset mnist --model lenet --clients 100 --nodes 1000 --warmup 1 --rounds 3 \
        --out-json docs/benchmarks/gradient_ends_lenet100.json \
        --out-md docs/benchmarks/gradient_ends_lenet100.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._common import load_average, machine_info, markdown_table, write_outputs
from benchmarks.bench_round_share import Captured, play
from fedowen_strategy.round.contribution import value_round
from fedowen_strategy.round.round_valuers import RoundValuation
from fedowen_strategy.torch_utility import CoalitionGame, CoalitionUtility
from fedowen_task.data import resolve_data_dir
from server_app.config import RunConfig, parse_run_config
from server_app.store.records import read_rounds


class ForwardEnds:
    """The app's utility factory, its games' gradient passes leaving the cache as they found
    it: the ends are then forwarded (before)."""

    def __init__(self, app: CoalitionUtility) -> None:
        self.app, self.games = app, []  # type: ignore[var-annotated]

    def __call__(self, global_state: Any, states: Any, num_examples: Any,
                 shares: Any = None) -> CoalitionGame:
        game = self.app(global_state, states, num_examples, shares=shares)
        terms = game.first_order

        def first_order(at: float = 0.5) -> np.ndarray:
            known = set(game._cache)
            out = terms(at)
            for key in set(game._cache) - known:
                del game._cache[key]
            return out

        game.first_order = first_order  # type: ignore[method-assign]
        self.games.append(game)
        return game


class Kept:
    """The app's utility factory, keeping the games it builds (their forward counts)."""

    def __init__(self, app: CoalitionUtility) -> None:
        self.app, self.games = app, []  # type: ignore[var-annotated]

    def __call__(self, global_state: Any, states: Any, num_examples: Any,
                 shares: Any = None) -> CoalitionGame:
        game = self.app(global_state, states, num_examples, shares=shares)
        self.games.append(game)
        return game


def value(game: Captured, cfg: RunConfig, factory: Kept | ForwardEnds, seed: list[int]
          ) -> RoundValuation:
    """The round valued as the app values it (its valuation, budget and game)."""
    return value_round(game.states, game.num_examples, game.global_state,
                       cfg.valuation_settings(), factory,
                       np.random.default_rng(seed))


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    run_config = {"dataset": args.dataset, "model": args.model, "valuation": args.valuation,
                  "clients-per-round": args.clients,
                  "num-server-rounds": args.warmup + args.rounds, "seed": args.seed,
                  "data-dir": str(args.data_dir), "device": "cpu", "torch-threads": 1,
                  "client-max-samples": args.client_max_samples,
                  "output-dir": str(work / "run")}
    started = time.perf_counter()
    app, games, rounds = play(run_config, args.nodes)
    print(f"the app's {len(rounds)} rounds took {time.perf_counter() - started:.0f}s",
          flush=True)
    cfg = parse_run_config(run_config)
    seconds = {r["round"]: float(r["round_seconds"]) for r in read_rounds(run_config["output-dir"])
               if r.get("round_seconds") is not None}
    rows: list[dict[str, Any]] = []
    for game, rec in zip(games, rounds, strict=True):
        if rec["round"] <= args.warmup:
            continue
        v_app, r_s = float(rec["valuation_seconds"]), seconds[rec["round"]]
        got: dict[str, list[tuple[RoundValuation, int]]] = {"before": [], "after": []}
        for rep in range(args.repeats):
            order = ("before", "after") if (rep + rec["round"]) % 2 == 0 else ("after", "before")
            for name in order:
                factory = ForwardEnds(app) if name == "before" else Kept(app)
                val = value(game, cfg, factory, [args.seed, rec["round"], 7])
                got[name].append((val, factory.games[-1].n_model_evals))
        row: dict[str, Any] = {"round": rec["round"], "players": len(game.states),
                               "eval_images": len(app.x_eval), "round_s": r_s,
                               "app_valuation_s": v_app}
        for name, runs in got.items():
            v = statistics.median(val.seconds for val, _ in runs)
            row[name] = {"seconds": v, "seconds_each": [val.seconds for val, _ in runs],
                         "forwards": runs[0][1], "n_evals": runs[0][0].n_evals,
                         "share": v / (r_s - v_app + v)}
        a, b = got["after"][0][0], got["before"][0][0]
        row["ratio"] = row["after"]["seconds"] / row["before"]["seconds"]
        row["max_abs_phi_diff"] = float(np.max(np.abs(a.phi_raw - b.phi_raw)))
        row["max_abs_ends_diff"] = max(abs(a.nu_empty - b.nu_empty), abs(a.nu_full - b.nu_full))
        rows.append(row)
        print(f"  round {rec['round']}: {row}; load {load_average()[0]:.1f}", flush=True)
    return {"rows": rows}


def tables(payload: dict[str, Any]) -> str:
    m, a = payload["machine"], payload["args"]
    text = (f"# The ends from the gradient passes: {a['valuation']}, {a['model']} on "
            f"{a['dataset']}, {a['clients']} clients a round (issue 71)\n\n"
            f"`PYTHONPATH=. {m['command']}` (started {m['started']}); {m['platform']}, "
            f"{m['cpu_count']} cores, torch {m['torch']} on one thread; load "
            f"{m['load_avg_start'][0]:.1f} at the start, {m['load_avg_end'][0]:.1f} at the "
            "end.\n\n")
    out = []
    for r in payload["rows"]:
        for name in ("before", "after"):
            v = r[name]
            out.append([r["round"], r["players"], r["eval_images"], name, v["n_evals"],
                        v["forwards"], f"{v['seconds']:.3f}", f"{v['share']:.0%}",
                        f"{r['round_s']:.1f}", f"{r['ratio']:.3f}" if name == "after" else "1",
                        f"{r['max_abs_phi_diff']:.1e}" if name == "after" else "",
                        f"{r['max_abs_ends_diff']:.1e}" if name == "after" else ""])
    return text + markdown_table(
        ["round", "players", "eval images", "path", "n_evals", "forwards", "valuation s "
         "(median)", "share of round", "round s (as played)", "after / before",
         "max abs phi diff", "max abs ends diff"], out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--model", default="lenet")
    p.add_argument("--valuation", default="first-order-simpson",
                   choices=("first-order-simpson", "first-order-refined"))
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--client-max-samples", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=4, help="valuations of each form a round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    args = p.parse_args(argv)
    args.data_dir = resolve_data_dir(args.data_dir)
    torch.set_num_threads(1)
    machine = machine_info()
    print(machine, flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-gradient-ends-") as tmp:
        result = measure(args, Path(tmp))
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    payload = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
               **result}
    write_outputs(payload, tables(payload), args.out_json, args.out_md)


if __name__ == "__main__":
    main()
