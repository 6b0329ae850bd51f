r"""The evaluation set's size: rank and weights of exact Shapley values on subsets of it (issue 71).

Reads :mod:`benchmarks.record_eval_blocks`' games (score sums per block of the evaluation set
over all 2^n coalitions of a real round). For each game and each subset size in ``--sizes``
(``size // block size`` blocks, so about that many images), ``--draws`` random unions of
blocks (every union when there are fewer) are scored,
``nu_U(S) = sum_{b in U} sums[b, S] / |U|``, and valued exactly (all 2^n coalitions); each is
compared with the exact values on the whole evaluation set:

* ``spearman``: Spearman's rho of the subset's exact values with the whole set's;
* ``weights_tv``: total variation between the default weights (softmax of l1-scaled phi,
  T = 1) from the two, the share of the aggregate that moves;
* ``spearman_disjoint``: Spearman between the subset's exact values and those of another
  subset of as many blocks disjoint from it (when the blocks suffice): the agreement of two
  independent evaluation sets of that size, without the overlap with the whole set that
  flatters ``spearman`` as the size grows;
* ``owen_antithetic_m4``: Spearman of the default estimator (``owen-antithetic``, M = 4, seed =
  the draw) run on the subset's game against the whole set's exact values: the subset's error
  and the estimator's together.

A forward's cost is about proportional to its images (a coalition's forward over ``s`` images
of ``E``: ``s / E`` of the app's), so ``cost`` is ``size / eval_size``. Outputs: JSON (every
draw), markdown (medians and worst draws per game and size), and a PNG (median Spearman against
size, per game).

    PYTHONPATH=. python benchmarks/bench_eval_subsets.py \
        --games docs/results/eval-subsets/games --out-json docs/results/eval-subsets/subsets.json \
        --out-md docs/results/eval-subsets/subsets.md \
        --out-png docs/results/eval-subsets/subsets.png
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import machine_info, markdown_table, write_outputs
from benchmarks.bench_ranking_battery import spearman, weights_error
from fedowen_strategy.valuation import estimate
from fedowen_strategy.valuation.exact import shapley_from_table
from fedowen_strategy.valuation.games import TableGame


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def unions(n_blocks: int, k: int, draws: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """``draws`` distinct k-subsets of the blocks (all of them when there are fewer)."""
    every = list(itertools.combinations(range(n_blocks), k))
    if len(every) <= draws:
        return every
    return [every[i] for i in sorted(rng.choice(len(every), draws, replace=False))]


def score_game(data: dict[str, Any], sizes: list[int], draws: int, seed: int
               ) -> list[dict[str, Any]]:
    """One row per (size, draw) of one game."""
    sums = np.asarray(data["block_sums"], dtype=np.float64)
    block_sizes = np.asarray(data["block_sizes"])
    size, n = data["meta"]["block_size"], data["meta"]["n"]
    truth = shapley_from_table(sums.sum(axis=0) / block_sizes.sum())
    rng = np.random.default_rng(seed)
    rows = []
    for images in sizes:
        k = images // size
        if images % size or not 0 < k <= len(sums):
            continue  # not a union of this game's blocks
        for d, chosen in enumerate(unions(len(sums), k, draws, rng)):
            idx = list(chosen)
            table = sums[idx].sum(axis=0) / block_sizes[idx].sum()
            phi = shapley_from_table(table)
            other = [b for b in rng.permutation(len(sums)) if b not in chosen][:k]
            twin = (shapley_from_table(sums[other].sum(axis=0) / block_sizes[other].sum())
                    if len(other) == k else None)
            owen = estimate("owen-antithetic", TableGame(table), n, budget=4 * n, seed=d).values
            rows.append({"size": images, "images": int(block_sizes[idx].sum()), "draw": d,
                         "spearman": round(spearman(phi, truth), 5),
                         "weights_tv": round(weights_error(phi, truth), 6),
                         "owen_antithetic_m4": round(spearman(owen, truth), 5),
                         "spearman_disjoint": None if twin is None
                         else round(spearman(phi, twin), 5)})
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and worst draw per (game, size)."""
    out = []
    for (game, size), group in itertools.groupby(
            sorted(rows, key=lambda r: (r["game"], r["size"])), key=lambda r: (r["game"],
                                                                                 r["size"])):
        sel = list(group)
        out.append({"game": game, "size": size, "draws": len(sel),
                    "images": statistics.mean(r["images"] for r in sel),
                    "eval_size": sel[0]["eval_size"],
                    "median_spearman": statistics.median(r["spearman"] for r in sel),
                    "worst_spearman": min(r["spearman"] for r in sel),
                    "median_weights_tv": statistics.median(r["weights_tv"] for r in sel),
                    "worst_weights_tv": max(r["weights_tv"] for r in sel),
                    "median_owen_m4": statistics.median(r["owen_antithetic_m4"] for r in sel),
                    "median_disjoint": statistics.median(twins) if (twins := [
                        r["spearman_disjoint"] for r in sel
                        if r["spearman_disjoint"] is not None]) else None})
    return out


def plot(summ: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for game in sorted({s["game"] for s in summ}):
        sel = sorted((s for s in summ if s["game"] == game), key=lambda s: s["size"])
        ax.plot([s["size"] for s in sel], [s["median_spearman"] for s in sel], marker="o",
                label=game)
    ax.set_xlabel("evaluation images per coalition")
    ax.set_ylabel("median Spearman with the whole set's exact phi")
    ax.set_xscale("log")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", default="docs/results/eval-subsets/games")
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 250])
    p.add_argument("--draws", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    p.add_argument("--out-png", default=None)
    args = p.parse_args(argv)
    paths = sorted(Path(args.games).glob("*.json.gz"))
    if not paths:
        p.error(f"no games in {args.games}: run benchmarks/record_eval_blocks.py")
    rows = []
    for path in paths:
        data = load(path)
        key = path.name.removesuffix(".json.gz")
        for row in score_game(data, args.sizes, args.draws, args.seed):
            rows.append({"game": key, "eval_size": data["meta"]["eval_size"],
                         "model": data["meta"]["model"], **row})
    summ = summary(rows)
    head = ["game", "images (of all)", "draws", "Spearman median (worst)",
            "weights tv median (worst)", "owen-antithetic M=4 on the subset, median",
            "two disjoint subsets, median Spearman"]
    body = [[s["game"], f"{s['images']:.0f} ({s['eval_size']})", s["draws"],
             f"{s['median_spearman']:.3f} ({s['worst_spearman']:.3f})",
             f"{s['median_weights_tv']:.4f} ({s['worst_weights_tv']:.4f})",
             f"{s['median_owen_m4']:.3f}",
             "-" if s["median_disjoint"] is None else f"{s['median_disjoint']:.3f}"]
            for s in summ]
    text = ("# Exact Shapley values on subsets of the evaluation set\n\nMade by "
            "`benchmarks/bench_eval_subsets.py` (see its docstring) from "
            f"`{args.games}`; each subset a uniformly random union of blocks; compared with the "
            "exact values on the whole evaluation set.\n\n" + markdown_table(head, body))
    write_outputs({"machine": machine_info(), "args": vars(args), "summary": summ,
                   "rows": rows}, text, args.out_json, args.out_md)
    if args.out_png:
        plot(summ, args.out_png)


if __name__ == "__main__":
    main()
