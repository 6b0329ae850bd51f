r"""Benchmark (issue 71): where a default-valuation round's seconds go on the CPU, and the
exact-preserving savings' before/after in one run.

For one setting (dataset, model, clients per round of a federation, images a client) the app
plays its own rounds in this process with the run config's defaults (``owen-antithetic``,
M = 4, delta game, neg-loss, links; one torch thread, CPU; :func:`bench_round_share.play`
keeps every valued game's inputs). Per measured round it counts what the default valuation
does: the rows the estimator asks for (cache hits included), the distinct coalitions among
them (``n_evals``, what the budget charges), the forwards the utility ran
(``CoalitionGame.n_model_evals``: distinct coalitions with zero updates left out), the
evaluation set's size, and the seconds per forward.

Before/after, in one run, on the same captured games:

* ``after``: today's utility (the app's factory);
* ``before``: main's path at 5ddc3c7 kept only here (:class:`BeforeGame`): contiguous forwards
  for every model and every distinct coalition forwarded, zero updates included.

Each measured round's game times ``--forwards`` random coalitions in both forms, alternating
one coalition at a time (the ratio ``forward after / before``: on a loaded machine two whole
valuations in a row differ by tens of percent on the same code, alternation cancels most of
it). ``--revalue full`` also values the round again with both, in rotating order
(``RoundValuation.seconds``; phi compared); ``--revalue forwards`` does not (ResNet-18, where
one valuation takes minutes): the before valuation is then the app's own with its forwards at
before's seconds per forward (said so in the output). ``share``:
``v / (round - v_app + v)``, the round as the app played it with its valuation replaced, where
the round is rounds.jsonl's ``round_seconds`` (selection, training, aggregation; not the central
evaluation; ``round_s_with_evaluation`` in the JSON adds it).

    PYTHONPATH=. FEDOWEN_DATA=/work/shared/data python benchmarks/bench_valuation_savings.py \
        --dataset mnist --model lenet --clients 100 --nodes 1000 --warmup 1 --rounds 2 \
        --out-json docs/benchmarks/valuation_savings_lenet.json
    PYTHONPATH=. FEDOWEN_DATA=/work/shared/data python benchmarks/bench_valuation_savings.py \
        --dataset cifar10 --model resnet18 --clients 10 --nodes 100 --client-max-samples 100 \
        --warmup 0 --rounds 1 --revalue forwards --forwards 4 \
        --out-json docs/benchmarks/valuation_savings_resnet18.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from benchmarks._common import load_average, machine_info, markdown_table, write_outputs
from benchmarks.bench_ranking_battery import spearman
from benchmarks.bench_round_share import Captured, play, round_seconds
from fedowen_strategy.round.contribution import ValuationSettings, value_round
from fedowen_strategy.round.round_valuers import RoundValuation, delta_shares
from fedowen_strategy.torch_utility import CoalitionGame, CoalitionUtility
from fedowen_strategy.valuation._base import CachedGame
from fedowen_task.data import resolve_data_dir
from server_app.config import RunConfig, parse_run_config
from server_app.store.records import read_rounds


class BeforeGame(CoalitionGame):
    """Main's utility (5ddc3c7): contiguous forwards, every distinct coalition forwarded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "memory_format": "contiguous"})
        self._zero = np.zeros(self.n, dtype=bool)


class Recorded:
    """A utility factory that keeps the games it builds (their forward counts)."""

    def __init__(self, app: CoalitionUtility, before: bool) -> None:
        self.app, self.before, self.games = app, before, []  # type: ignore[var-annotated]

    def __call__(self, global_state: Any, states: Any, num_examples: Any,
                 shares: Any = None) -> CoalitionGame:
        if self.before:
            net, x, y = self.app._prepare()
            game: CoalitionGame = BeforeGame(
                self.app.model, global_state, states, num_examples, x, y,
                metric=self.app.metric, device=self.app.device, shares=shares, net=net,
                **self.app.options)
        else:
            game = self.app(global_state, states, num_examples, shares=shares)
        self.games.append(game)
        return game


@contextmanager
def counting_rows() -> Iterator[list[int]]:
    """Count the rows every estimator asks its budgeted game for (cache hits included)."""
    rows, original = [0], CachedGame.__call__

    def call(self: CachedGame, masks: np.ndarray) -> np.ndarray:
        rows[0] += len(masks)
        return original(self, masks)

    with mock.patch.object(CachedGame, "__call__", call):
        yield rows


def value(game: Captured, cfg: RunConfig, factory: Recorded, seed: list[int]
          ) -> tuple[RoundValuation, int, int]:
    """The round valued with the defaults; (valuation, rows asked, forwards run)."""
    settings = ValuationSettings(game=cfg.game, aggregation=cfg.choices().aggregation)
    with counting_rows() as rows:
        val = value_round(game.states, game.num_examples, game.global_state, settings,
                          factory, np.random.default_rng(seed))
    return val, rows[0], factory.games[-1].n_model_evals


def forward_seconds(game: Captured, cfg: RunConfig, app: CoalitionUtility, k: int, seed: int
                    ) -> dict[str, Any]:
    """Seconds per forward of ``k`` random coalitions, before and after, alternating."""
    shares = delta_shares(cfg.choices().aggregation, game.num_examples)
    games = {name: Recorded(app, name == "before")(game.global_state, game.states,
                                                   game.num_examples, shares=shares)
             for name in ("before", "after")}
    masks = np.random.default_rng(seed).random((k, len(game.states))) < 0.5
    times: dict[str, list[float]] = {"before": [], "after": []}
    values: dict[str, list[float]] = {"before": [], "after": []}
    for i, mask in enumerate(masks):
        for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
            start = time.perf_counter()
            values[name].append(float(games[name](mask[None])[0]))
            times[name].append(time.perf_counter() - start)
    diff = float(np.max(np.abs(np.subtract(values["before"], values["after"]))))
    return {"k": k, "before_s": statistics.median(times["before"]),
            "after_s": statistics.median(times["after"]),
            "ratio": statistics.median(a / b for a, b in zip(times["after"], times["before"],
                                                             strict=True)),
            "max_abs_nu_diff": diff,
            "memory_format": str(games["after"].memory_format)}


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    run_config = {"dataset": args.dataset, "model": args.model,
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
    records = read_rounds(run_config["output-dir"])
    with_eval = round_seconds(rounds, records)
    # the acceptance's round: rounds.jsonl's round_seconds (selection, training, aggregation;
    # not the central evaluation); the elapsed difference, evaluation included, beside it
    seconds = {r["round"]: float(r["round_seconds"]) for r in records
               if r.get("round_seconds") is not None}
    rows: list[dict[str, Any]] = []
    for k, (game, rec) in enumerate(zip(games, rounds, strict=True)):
        if rec["round"] <= args.warmup:
            continue
        v_app, r_s = float(rec["valuation_seconds"]), seconds[rec["round"]]
        row: dict[str, Any] = {
            "round": rec["round"], "players": len(game.states), "eval_images": len(app.x_eval),
            "round_s": r_s, "round_s_with_evaluation": with_eval[rec["round"]],
            "app_valuation_s": v_app, "app_n_evals": rec.get("n_evals"),
            "app_share": v_app / r_s}
        if args.revalue == "full":
            order = ("before", "after") if k % 2 == 0 else ("after", "before")
            got = {name: value(game, cfg, Recorded(app, name == "before"),
                               [args.seed, rec["round"], 7]) for name in order}
            for name, (val, asked, forwards) in got.items():
                row[name] = {"seconds": val.seconds, "rows_asked": asked,
                             "n_evals": val.n_evals, "forwards": forwards,
                             "s_per_forward": val.seconds / max(forwards, 1),
                             "share": val.seconds / (r_s - v_app + val.seconds)}
            b, a = got["before"][0], got["after"][0]
            row["ratio"] = a.seconds / b.seconds
            row["forwards_timed"] = forward_seconds(game, cfg, app, args.forwards,
                                                    args.seed + rec["round"])
            row["max_abs_phi_diff"] = float(np.max(np.abs(a.phi_raw - b.phi_raw)))
            row["spearman_before_after"] = spearman(a.phi_raw, b.phi_raw)
        else:
            f = forward_seconds(game, cfg, app, args.forwards, args.seed + rec["round"])
            forwards = int(rec.get("n_evals") or 0)  # the app's distinct coalitions
            v_before = v_app + forwards * (f["before_s"] - f["after_s"])
            row["forwards_timed"] = f
            row["after"] = {"seconds": v_app, "share": v_app / r_s, "n_evals": forwards}
            row["before"] = {"seconds": v_before, "share": v_before / (r_s - v_app + v_before),
                             "derived": "the app's valuation with its forwards at before's "
                                        "seconds per forward"}
            row["ratio"] = v_app / v_before
        rows.append(row)
        print(f"  round {rec['round']}: {row}; load {load_average()[0]:.1f}", flush=True)
    return {"rows": rows}


def tables(payload: dict[str, Any]) -> str:
    m, a = payload["machine"], payload["args"]
    text = (f"# Valuation savings, {a['model']} on {a['dataset']}, {a['clients']} clients a "
            f"round (issue 71)\n\n`PYTHONPATH=. {m['command']}` (started {m['started']}); "
            f"{m['platform']}, {m['cpu_count']} cores, torch {m['torch']} on one thread; load "
            f"{m['load_avg_start'][0]:.1f} at the start, {m['load_avg_end'][0]:.1f} at the "
            "end.\n\n")
    out = []
    for r in payload["rows"]:
        for name in ("before", "after"):
            v = r[name]
            out.append([r["round"], r["players"], r["eval_images"], name,
                        v.get("rows_asked", ""), v.get("n_evals", ""), v.get("forwards", ""),
                        f"{v['seconds']:.2f}", f"{v['share']:.0%}", f"{r['round_s']:.1f}",
                        f"{r['ratio']:.3f}" if name == "after" else "1"])
    text += markdown_table(["round", "players", "eval images", "path", "rows asked",
                            "distinct (n_evals)", "forwards", "valuation s", "share of round",
                            "round s (as played)", "after / before"], out)
    text += "\nSeconds per forward, random coalitions alternating before/after:\n\n"
    text += markdown_table(
        ["round", "coalitions", "before s", "after s", "after / before (median)",
         "max abs nu diff", "after's format"],
        [[r["round"], f["k"], f"{f['before_s']:.3f}", f"{f['after_s']:.3f}",
          f"{f['ratio']:.3f}", f"{f['max_abs_nu_diff']:.1e}", f["memory_format"]]
         for r in payload["rows"] for f in [r["forwards_timed"]]])
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--model", default="lenet")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--client-max-samples", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--revalue", choices=("full", "forwards"), default="full")
    p.add_argument("--forwards", type=int, default=40, help="coalitions timed per form")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    args = p.parse_args(argv)
    args.data_dir = resolve_data_dir(args.data_dir)
    torch.set_num_threads(1)
    machine = machine_info()
    print(machine, flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-valuation-savings-") as tmp:
        result = measure(args, Path(tmp))
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    payload = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
               **result}
    write_outputs(payload, tables(payload), args.out_json, args.out_md)


if __name__ == "__main__":
    main()
