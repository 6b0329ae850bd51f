"""MSE of every valuation method (and owen variants) against ``exact``, at budgets N x M.

Games (n = 10): an additive game with pairwise interactions, a weighted voting game and the
recorded FedAvg round (tests/data/fl_game_mnist_lenet_n10.json, benchmarks/record_fl_game.py).
For each game, M in {4, 10, 40} and each method, the MSE over players and seeds, the squared
bias part of it (mean over players of (mean over seeds - exact)^2) and the harness throughput
(evaluations per second, estimator overhead included, table-lookup utilities) are printed as
Markdown. shapiq's approximators run at the same budget when ``import shapiq`` works (an
optional benchmark dependency: ``pip install shapiq``; never a runtime one).

    python benchmarks/bench_valuation.py --seeds 50 --out docs/valuation-benchmark.md
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedowen_strategy.valuation import estimate
from fedowen_strategy.valuation.games import TableGame, interaction_game, voting_game

ROOT = Path(__file__).resolve().parents[1]
FL_GAME = ROOT / "tests" / "data" / "fl_game_mnist_lenet_n10.json"
MS = (4, 10, 40)

VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("owen (default)", "owen", {}),
    ("owen walk, antithetic, eta=0.05", "owen", {"antithetic": True, "eta": 0.05}),
    ("owen walk, antithetic", "owen", {"sampler": "walk", "antithetic": True}),
    ("owen walk, no antithetic", "owen", {"sampler": "walk", "antithetic": False}),
    ("owen walk, antithetic, unstratified", "owen", {"antithetic": True, "strata": 1}),
    ("owen walk, eta=0.05", "owen", {"eta": 0.05}),
    ("owen walk, no antithetic, eta=0.05", "owen", {"antithetic": False, "eta": 0.05}),
    ("owen flip, antithetic", "owen", {"sampler": "flip", "antithetic": True}),
    ("owen flip, no antithetic", "owen", {"sampler": "flip", "antithetic": False}),
    ("owen-paper (Q=2, eta=0.01)", "owen-paper", {}),
    ("owen-paper (Q=2, eta=0)", "owen-paper", {"eta": 0.0}),
    ("mc-shapley", "mc-shapley", {}),
    ("mc-shapley antithetic", "mc-shapley", {"antithetic": True}),
    ("gtg-shapley (eps=1e-3)", "gtg-shapley", {}),
    ("banzhaf (MSR)", "banzhaf", {}),
    ("weighted-shap Beta(16,1)", "weighted-shap", {}),
    ("loo", "loo", {}),
]


def shapiq_variants() -> list[tuple[str, Callable[[Any, int, int, int], np.ndarray]]]:
    """shapiq approximators at equal budget, when shapiq imports."""
    try:
        from shapiq.approximator import (
            SVARM,
            KernelSHAP,
            OwenSamplingSV,
            PermutationSamplingSV,
        )
    except Exception as exc:  # optional dependency: any import failure means "skip"
        print(f"shapiq not available ({exc!r}); skipping its approximators", file=sys.stderr)
        return []

    def runner(cls: Any) -> Callable[[Any, int, int, int], np.ndarray]:
        def run(game: Any, n: int, budget: int, seed: int) -> np.ndarray:
            res = cls(n=n, random_state=seed).approximate(budget=budget, game=game)
            return np.array([res[(i,)] for i in range(n)])

        return run

    return [
        (f"shapiq {c.__name__}", runner(c))
        for c in (PermutationSamplingSV, OwenSamplingSV, SVARM, KernelSHAP)
    ]


def games() -> dict[str, Any]:
    return {
        "interaction": interaction_game(),
        "voting": voting_game(),
        "fl-mnist": TableGame.from_json(FL_GAME),
    }


class Counter:
    """Counts rows passed to a game (to check the shapiq runs' budgets)."""

    def __init__(self, game: Any) -> None:
        self.game, self.rows = game, 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.atleast_2d(masks)  # some shapiq approximators pass one coalition as 1-D
        self.rows += len(masks)
        return self.game(masks)


def run_all(n_seeds: int) -> list[dict[str, Any]]:
    rows = []
    runners: list[tuple[str, Callable[[Any, int, int, int], np.ndarray]]] = []
    for label, method, params in VARIANTS:
        def ours(game: Any, n: int, b: int, s: int, method=method, params=params) -> np.ndarray:
            return estimate(method, game, n, budget=b, seed=s, **params).values

        runners.append((label, ours))
    runners += shapiq_variants()
    for game_name, game in games().items():
        n = game.n_players
        truth = estimate("exact", game, n, budget=1 << n, seed=0).values
        for m in MS:
            budget = n * m
            for label, run in runners:
                counter = Counter(game)
                t0 = time.perf_counter()
                vals = np.array([run(counter, n, budget, s) for s in range(n_seeds)])
                dt = time.perf_counter() - t0
                rows.append({
                    "game": game_name, "M": m, "method": label,
                    "mse": float(np.mean((vals - truth) ** 2)),
                    "bias2": float(np.mean((vals.mean(axis=0) - truth) ** 2)),
                    "evals": counter.rows / n_seeds,
                    "evals_per_s": counter.rows / dt,
                })
            print(f"done {game_name} M={m}", file=sys.stderr)
    return rows


def to_markdown(rows: list[dict[str, Any]], n_seeds: int, command: str) -> str:
    out = [
        "# Valuation benchmark: MSE against exact Shapley values",
        "",
        f"Made by `{command}` ({n_seeds} seeds per cell, n = 10 players, budget = 10 x M).",
        "MSE over players and seeds; bias^2 = mean over players of (mean over seeds - exact)^2;",
        "evals = utility rows per call (<= budget); evals/s = harness throughput on",
        "table-lookup games, estimator overhead included. Best MSE per row in bold.",
        "",
    ]
    for game_name in dict.fromkeys(r["game"] for r in rows):
        methods = list(dict.fromkeys(r["method"] for r in rows if r["game"] == game_name))
        out += [f"## {game_name}", "", "| method | " + " | ".join(
            f"MSE M={m} | bias^2 M={m}" for m in MS) + " | evals M=40 | evals/s |",
            "|---|" + "---:|" * (2 * len(MS) + 2)]
        cell = {(r["method"], r["M"]): r for r in rows if r["game"] == game_name}
        best = {m: min(cell[meth, m]["mse"] for meth in methods) for m in MS}
        for meth in methods:
            parts = []
            for m in MS:
                r = cell[meth, m]
                mse = f"{r['mse']:.2e}"
                parts += [f"**{mse}**" if r["mse"] == best[m] else mse, f"{r['bias2']:.1e}"]
            r40 = cell[meth, 40]
            out.append(f"| {meth} | " + " | ".join(parts)
                       + f" | {r40['evals']:.0f} | {r40['evals_per_s']:.0f} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None, help="also write the Markdown here")
    args = ap.parse_args()
    command = "python benchmarks/bench_valuation.py " + " ".join(sys.argv[1:])
    text = to_markdown(run_all(args.seeds), args.seeds, command.strip())
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
