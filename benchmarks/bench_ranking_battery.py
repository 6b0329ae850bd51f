r"""Ranking battery: mean Spearman against exact Shapley on the recorded app games, per half.

The games are the full 2^n tables of real rounds recorded by benchmarks/record_app_games.py
(tests/data/games: delta game, neg-loss, MNIST / Fashion-MNIST / CIFAR-10, alpha 0.1 and 0.01,
rounds 3, 10, 30), split once into a development and a reporting half (``manifest.json``,
written before any game was recorded). Exact Shapley values come from each table.

Every estimator runs through :func:`fedowen_strategy.valuation.estimate` on the table under
the app's budget ``n x M`` (evaluations counted as in the app: the empty and grand coalitions
included, cached repeats free) for ``M`` in ``--ms`` and ``--seeds`` estimator seeds, with the
parameters the ServerApp passes (``RunConfig.estimator_params``). For each (estimator, M, half)
the table gives the mean Spearman correlation with the exact values over all games and seeds
(an estimate with no spread, e.g. all zeros, counts as 0), and the JSON keeps the per-game
means, the evaluations used and the first-order calls. ``first-order`` spends the two end
evaluations and one gradient whatever M is; its cost in evaluations is the recorded time of a
backward pass over the time of one coalition evaluation (``meta.seconds_first_order /
meta.seconds_per_eval``), reported beside the table.

    PYTHONPATH=. python benchmarks/bench_ranking_battery.py \
        --out-json docs/benchmarks/ranking_battery.json.gz \
        --out-md docs/benchmarks/ranking_battery.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from benchmarks._common import machine_info, markdown_table, write_outputs
from fedowen_strategy.round.aggregation import softmax_weights
from fedowen_strategy.round.round_valuers import scale_phi
from fedowen_strategy.valuation import ESTIMATORS as ESTIMATOR_SPECS
from fedowen_strategy.valuation import estimate
from fedowen_strategy.valuation.exact import shapley_from_table
from fedowen_strategy.valuation.games import TableGame
from server_app.config import RunConfig

#: (label, registered method, extra parameters)
ESTIMATORS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("owen", "owen", {}),
    ("owen-antithetic", "owen-antithetic", {}),
    ("owen-paper", "owen-paper", {}),
    ("svarm", "svarm", {}),
    ("kernel-shap", "kernel-shap", {}),
    ("kadd-shap", "kadd-shap", {}),
    ("loo", "loo", {}),
    ("first-order at=0", "first-order", {"at": 0.0}),
    ("first-order at=0.5", "first-order", {"at": 0.5}),
    ("first-order at=1", "first-order", {"at": 1.0}),
    ("first-order-refined", "first-order-refined", {}),
    ("first-order-refined band=0 (Simpson)", "first-order-refined", {"band": 0.0}),
    ("first-order-refined band=1", "first-order-refined", {"band": 1.0}),
    ("first-order-refined pairs=1", "first-order-refined", {"pairs": 1}),
    ("first-order-refined pairs=3", "first-order-refined", {"pairs": 3}),
    ("first-order-simpson", "first-order-simpson", {}),
)
HALVES = ("dev", "report")
#: Estimators that credit a zero update exactly 0 (valuation/__init__.py's axiom table)
NULL_EXACT = ("owen", "owen-antithetic", "owen-paper", "loo", "first-order",
              "first-order-refined", "first-order-simpson")


def spearman(estimate_values: np.ndarray, exact_values: np.ndarray) -> float:
    """Spearman's rho; 0 for an estimate without spread (it ranks nothing)."""
    if np.ptp(estimate_values) == 0 or np.ptp(exact_values) == 0:
        return 0.0
    return float(spearmanr(estimate_values, exact_values).statistic)


def weights_error(estimate_values: np.ndarray, exact_values: np.ndarray) -> float:
    """Total variation between the app's default weights (softmax of l1-scaled phi, T = 1)
    from the estimate and from the exact values: the share of the aggregate misplaced."""
    def weights(values: np.ndarray) -> np.ndarray:
        return softmax_weights(scale_phi(values, 0.0, "l1"))
    return 0.5 * float(np.abs(weights(estimate_values) - weights(exact_values)).sum())


def load_games(folder: Path) -> dict[str, tuple[str, TableGame]]:
    """``key -> (half, game)`` for every game of the manifest that is recorded."""
    halves = json.loads((folder / "manifest.json").read_text())["halves"]
    return {key: (half, TableGame.from_json(folder / f"{key}.json.gz"))
            for key, half in halves.items() if (folder / f"{key}.json.gz").exists()}


def score_game(game: TableGame, method: str, params: dict[str, Any], m: int,
               seeds: int) -> dict[str, Any]:
    """Spearman per seed of one estimator at one M on one game, and what it spent."""
    n = game.n_players
    truth = shapley_from_table(game.table)
    rhos, errors, evals, grads = [], [], [], []
    for seed in range(seeds):
        result = estimate(method, game, n, budget=n * m, seed=seed, **params)
        rhos.append(spearman(result.values, truth))
        errors.append(weights_error(result.values, truth))
        evals.append(result.n_evals)
        grads.append(result.n_gradients)
    meta = game.meta
    seconds = (statistics.mean(evals) * meta["seconds_per_eval"]
               + statistics.mean(grads) * meta["seconds_first_order"]) if meta else float("nan")
    return {"spearman": round(statistics.mean(rhos), 5),
            "spearman_sd": round(statistics.pstdev(rhos), 5),
            "weights_tv": round(statistics.mean(errors), 6),
            "n_evals": statistics.mean(evals), "n_gradients": statistics.mean(grads),
            "seconds_recorded": round(seconds, 4)}


def params_of(method: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The parameters the ServerApp passes the method, plus the row's own."""
    return {**RunConfig(valuation=method).estimator_params(), **extra}


def run(games: dict[str, tuple[str, TableGame]], ms: list[int], seeds: int,
        labels: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per (estimator, M, game): the mean and spread of Spearman over the seeds
    (``labels``: only those rows of :data:`ESTIMATORS`)."""
    rows = []
    for label, method, extra in ESTIMATORS:
        if labels and label not in labels:
            continue
        for m in ms:
            for key, (half, game) in games.items():
                if game.n_players * m < ESTIMATOR_SPECS[method].min_budget(game.n_players):
                    continue  # the budget cannot buy what the method needs: no row
                scored = score_game(game, method, params_of(method, extra), m, seeds)
                rows.append({"estimator": label, "m": m, "game": key, "half": half, **scored})
            print(f"{label:20s} M={m:<3d} done", flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean Spearman (over games and seeds) per (estimator, M, half)."""
    out = []
    for label, _, _ in ESTIMATORS:
        for m in sorted({r["m"] for r in rows}):
            for half in HALVES:
                sel = [r for r in rows if (r["estimator"], r["m"], r["half"]) == (label, m, half)]
                if not sel:
                    continue
                per_game = [r["spearman"] for r in sel]
                out.append({"estimator": label, "m": m, "half": half, "games": len(sel),
                            "mean_spearman": statistics.mean(per_game),
                            "se_over_games": statistics.stdev(per_game) / len(sel) ** 0.5
                            if len(sel) > 1 else 0.0,
                            "worst_game": min(per_game),
                            "weights_tv": statistics.mean(r["weights_tv"] for r in sel),
                            "worst_weights_tv": max(r["weights_tv"] for r in sel),
                            "seconds_recorded": statistics.mean(r["seconds_recorded"]
                                                                for r in sel),
                            "n_evals": statistics.mean(r["n_evals"] for r in sel),
                            "n_gradients": statistics.mean(r["n_gradients"] for r in sel)})
    return out


def first_order_cost(games: dict[str, tuple[str, TableGame]]) -> dict[str, float]:
    """Recorded seconds of one backward pass over seconds of one evaluation, per dataset."""
    ratios: dict[str, list[float]] = {}
    for _, game in games.values():
        meta = game.meta
        ratios.setdefault(meta["dataset"], []).append(meta["seconds_first_order"]
                                                      / meta["seconds_per_eval"])
    return {d: statistics.median(r) for d, r in sorted(ratios.items())}


def table(summ: list[dict[str, Any]], ms: list[int], costs: dict[str, float]) -> str:
    """Markdown: one row per estimator, mean Spearman (worst game) and the weights' mean total
    variation per M on each half."""
    halves = [h for h in HALVES if any(s["half"] == h for s in summ)]
    head = (["estimator"] + [f"{h} M={m}" for h in halves for m in ms]
            + ["evals at M=4", "null player"])
    body = []
    for label, method, _ in ESTIMATORS:
        cells = {(s["half"], s["m"]): s for s in summ if s["estimator"] == label}
        if not cells:
            continue
        row = [label] + [f"{c['mean_spearman']:.3f} ({c['worst_game']:.3f}) tv "
                         f"{c['weights_tv']:.4f}" if (c := cells.get((h, m))) else "-"
                         for h in halves for m in ms]
        at4 = cells.get((halves[0], 4))
        grads = f" + {at4['n_gradients']:.0f} grad" if at4 and at4["n_gradients"] else ""
        row.append(f"{at4['n_evals']:.1f}{grads}" if at4 else "-")
        row.append("exact" if method in NULL_EXACT else "in expectation")
        body.append(row)
    games = {s["half"]: s["games"] for s in summ}
    note = ("\nMean Spearman with exact Shapley over games x seeds (worst game's mean in "
            "brackets), and tv: the mean total variation between the default weights (softmax "
            "of l1-scaled phi) from the estimate and from exact Shapley; "
            + ", ".join(f"{h}: {games[h]} games" for h in halves) + ". One gradient "
            "(first-order) costs about " + ", ".join(f"{v:.1f} evaluations ({d})"
                                                     for d, v in costs.items())
            + " (recorded backward pass / coalition evaluation, one core).\n")
    return markdown_table(head, body) + note


BREAKDOWN = (("owen", 4), ("owen-antithetic", 2), ("owen-antithetic", 4),
             ("first-order at=0", 4), ("first-order at=0.5", 4), ("first-order-refined", 1),
             ("first-order-refined", 4))


def breakdown(rows: list[dict[str, Any]], games: dict[str, tuple[str, TableGame]],
              half: str = "report") -> str:
    """Markdown: per game of ``half``, the mean Spearman of a few estimators."""
    head = [f"game ({half} half)", "gain nu(N) - nu(0)"] + [f"{e} M={m}" for e, m in BREAKDOWN]
    body = []
    for key, (game_half, game) in sorted(games.items()):
        if game_half != half:
            continue
        cells = []
        for label, m in BREAKDOWN:
            sel = [r for r in rows if (r["estimator"], r["m"], r["game"]) == (label, m, key)]
            cells.append(f"{sel[0]['spearman']:.3f}" if sel else "-")
        body.append([key, f"{game.table[-1] - game.table[0]:+.4f}", *cells])
    return markdown_table(head, body)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", default="tests/data/games")
    p.add_argument("--ms", type=int, nargs="+", default=[2, 4, 10])
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--estimators", nargs="+", default=None, choices=[e[0] for e in ESTIMATORS],
                   metavar="LABEL", help="only these rows of ESTIMATORS (default: all)")
    p.add_argument("--halves", nargs="+", default=list(HALVES), choices=HALVES,
                   help="only the games of these halves (choose on dev, report once)")
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    args = p.parse_args(argv)
    games = {k: v for k, v in load_games(Path(args.games)).items() if v[0] in args.halves}
    if not games:
        p.error(f"no recorded games in {args.games}: run benchmarks/record_app_games.py")
    rows = run(games, args.ms, args.seeds, args.estimators)
    summ = summary(rows)
    costs = first_order_cost(games)
    shown = "report" if "report" in args.halves else args.halves[0]
    meta = {key: {k: game.meta.get(k) for k in ("dataset", "alpha", "round", "seed", "n")}
            for key, (_, game) in games.items()}
    text = (f"# Ranking battery: Spearman with exact Shapley on {len(games)} recorded app "
            "games\n\nMade by `benchmarks/bench_ranking_battery.py` (see its docstring) from "
            "`tests/data/games` (`benchmarks/record_app_games.py`). Budget = n x M coalition "
            f"evaluations (n = 10), {args.seeds} estimator seeds per game.\n\n"
            + table(summ, args.ms, costs) + f"\n## Per game, {shown} half\n\n"
            + breakdown(rows, games, shown))
    estimators = {label: {"method": method, "params": params_of(method, extra)}
                  for label, method, extra in ESTIMATORS}
    write_outputs({"machine": machine_info(), "args": vars(args), "games": meta,
                   "estimators": estimators,
                   "first_order_cost_in_evals": costs, "summary": summ, "rows": rows},
                  text, args.out_json, args.out_md)


if __name__ == "__main__":
    main()
