"""MSE of the Shapley estimators on reference games with closed-form values, at budget n x M.

Games: glove (unbalanced), airport, weighted voting and a sum of unanimity games (SOUM) at
n in {10, 14} (``fedowen_strategy.valuation.games.reference_games``, values in closed form),
plus the FedAvg-round game (recorded MNIST/LeNet round, n = 10, exact values by enumeration)
and the pairwise-interaction game (n = 10 and 14). For every cell (game, n, M) and method:
the MSE over players and ``--seeds`` seeds, its squared-bias part, and the ratio to the
cell's lowest MSE. The summary counts, per method, the cells within 1.2x of the lowest MSE
and the worst ratio. Writes Markdown (``--out``) and JSON (``--out-json``)::

    PYTHONPATH=. python benchmarks/bench_valuation_reference.py --seeds 50 \\
        --out docs/valuation-reference.md --out-json docs/benchmarks/valuation_reference.json.gz
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import read_json, write_json
from fedowen_strategy.valuation import estimate
from fedowen_strategy.valuation.games import TableGame, interaction_game, reference_games

ROOT = Path(__file__).resolve().parents[1]
FL_GAME = ROOT / "tests" / "data" / "fl_game_mnist_lenet_n10.json"
MS = (4, 10, 40, 200)
NS = (10, 14)
TOL = 1.2
EXACT = 1e-20  # MSE below this is exact up to rounding (1e-35 .. 1e-26 by method): one class
METHODS: list[tuple[str, str, dict[str, Any]]] = [
    ("owen", "owen", {}),
    ("owen-paper", "owen-paper", {}),
    ("mc-shapley", "mc-shapley", {}),
    ("gtg-shapley", "gtg-shapley", {}),
    ("svarm", "svarm", {}),
    ("svarm kernel sizes", "svarm", {"proposal": "kernel"}),
    ("kernel-shap", "kernel-shap", {}),
    ("leverage-shap", "leverage-shap", {}),
    ("kadd-shap", "kadd-shap", {}),
    ("kadd-shap ridge=1e-2", "kadd-shap", {"ridge": 1e-2}),
]


def cells() -> list[tuple[str, int, Any, np.ndarray]]:
    """(game name, n, game, exact values) for every benchmark game."""
    out: list[tuple[str, int, Any, np.ndarray]] = []
    fl = TableGame.from_json(FL_GAME)
    out.append(("fedavg-mnist", 10, fl, estimate("exact", fl, 10, budget=1024, seed=0).values))
    for n in NS:
        inter = interaction_game(n)
        out.append(("interaction", n, inter, inter.shapley_values()))
        for name, game in reference_games(n).items():
            out.append((name, n, game, game.shapley_values()))  # type: ignore[attr-defined]
    return out


def run(n_seeds: int, methods: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for name, n, game, truth in cells():
        for m in MS:
            for label, method, params in methods:
                t0 = time.perf_counter()
                vals = np.array([
                    estimate(method, game, n, budget=n * m, seed=s, **params).values
                    for s in range(n_seeds)
                ])  # fmt: skip
                rows.append({
                    "game": name, "n": n, "M": m, "method": label,
                    "mse": float(np.mean((vals - truth) ** 2)),
                    "bias2": float(np.mean((vals.mean(axis=0) - truth) ** 2)),
                    "seconds": time.perf_counter() - t0,
                })  # fmt: skip
            print(f"done {name} n={n} M={m}", file=sys.stderr, flush=True)
    return with_ratios(rows)


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add each row's MSE over its cell's lowest (both floored at ``EXACT``)."""
    best: dict[tuple[str, int, int], float] = {}
    for r in rows:
        key = (r["game"], r["n"], r["M"])
        best[key] = min(best.get(key, np.inf), r["mse"])
    for r in rows:
        floor = max(best[r["game"], r["n"], r["M"]], EXACT)
        r["ratio"] = max(r["mse"], EXACT) / floor
    return rows


def _fmt_ratio(r: float) -> str:
    return f"{r:.1f}" if r < 1e4 else f"{r:.0e}"


def to_markdown(rows: list[dict[str, Any]], labels: list[str], command: str) -> str:
    out = [f"Made by `{command}`. MSE against the exact Shapley values over the seeds;",
           "budget = n x M utility evaluations; best per row in bold; an MSE below 1e-20 (exact",
           "up to rounding) counts as 1e-20 for the ratios.", ""]  # fmt: skip
    out += ["| game | n | M | " + " | ".join(labels) + " |",
            "|---|---:|---:|" + "---:|" * len(labels)]
    keys = list(dict.fromkeys((r["game"], r["n"], r["M"]) for r in rows))
    cell = {(r["game"], r["n"], r["M"], r["method"]): r for r in rows}
    for g, n, m in keys:
        parts = []
        for lab in labels:
            r = cell[g, n, m, lab]
            txt = f"{r['mse']:.1e}"
            parts.append(f"**{txt}**" if r["ratio"] <= 1.0 + 1e-12 else txt)
        out.append(f"| {g} | {n} | {m} | " + " | ".join(parts) + " |")
    out += ["", f"Summary over {len(keys)} cells: cells within {TOL}x of the lowest MSE, the",
            "worst and the median ratio to the lowest MSE.", "",
            "| method | cells within 1.2x | worst ratio | median ratio |", "|---|---:|---:|---:|"]
    for lab in labels:
        ratios = [cell[g, n, m, lab]["ratio"] for g, n, m in keys]
        ok = sum(r <= TOL for r in ratios)
        out.append(f"| {lab} | {ok} / {len(keys)} | {_fmt_ratio(max(ratios))} "
                   f"| {_fmt_ratio(float(np.median(ratios)))} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--out-json", type=Path, default=None)
    ap.add_argument("--from-json", type=Path, default=None,
                    help="re-render the tables from an earlier --out-json instead of running")
    args = ap.parse_args()
    script = "PYTHONPATH=. python benchmarks/bench_valuation_reference.py "
    command = script + " ".join(sys.argv[1:])
    if args.from_json:
        saved = read_json(args.from_json)
        rows, args.seeds = with_ratios(saved["rows"]), saved["seeds"]
        script = "PYTHONPATH=. python benchmarks/bench_valuation_reference.py "
        command = script + f"--seeds {args.seeds}"
    else:
        rows = run(args.seeds, METHODS)
    labels = list(dict.fromkeys(r["method"] for r in rows))
    text = to_markdown(rows, labels, command.strip())
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.out_json:
        write_json(args.out_json, {"seeds": args.seeds, "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
