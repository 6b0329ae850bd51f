r"""Record real rounds with coalition scores per block of the evaluation set (issue 71, deliver 3).

The rounds are :mod:`benchmarks.record_app_games`' (the app's own run in one process, the same
cells, seeds and warm-up), but each kept game is enumerated once per *block*: the evaluation set
(599 images for MNIST, 600 for Fashion-MNIST, 500 for CIFAR-10) shuffled by ``--block-seed``
and cut into blocks of about ``--block-size`` images, and every block scored as a game of its
own (the app's :class:`~fedowen_strategy.torch_utility.CoalitionUtility` on that block's
images, the same global model, updates and shares). A block's row holds its score *sums*
over all 2^n coalitions, so any union of blocks, i.e. a uniformly random (not
class-stratified) subset of the evaluation set, is scored from this one pass:
``nu_U(S) = sum_{b in U} sums[b, S] / |U|``; the union of all blocks is the whole set (the
app's game, up to float rounding). No first-order terms.

Output: one ``<dataset>_a<alpha>_r<round>_s<seed>.json.gz`` per game in ``--out``
(``block_sums``: float32, one row per block; ``block_sizes``; ``utilities``: the whole set's
table from the blocks; ``meta``), read by benchmarks/bench_eval_subsets.py.

    PYTHONPATH=. FEDOWEN_DATA=/work/shared/data python benchmarks/record_eval_blocks.py \
        --out docs/results/eval-subsets/games --alphas 0.1 --seeds 0 --rounds 3 10
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.record_app_games import (
    DATASETS,
    CapturingUtility,
    Cell,
    f32,
    play,
    run_config,
    table_of,
    write_game,
)
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_task.data import resolve_data_dir

FORMAT = "fedowen-eval-blocks/1"


def blocks_of(n_images: int, size: int, seed: int) -> list[np.ndarray]:
    """The evaluation set's indices, shuffled by ``seed``, cut into ``n_images // size`` blocks
    of near-equal sizes (at least ``size`` each: 599 images in blocks of 50 make 11 of 54-55)."""
    if not 0 < size <= n_images:
        raise ValueError(f"block size {size} must lie in [1, {n_images}] (the evaluation set)")
    order = np.random.default_rng(seed).permutation(n_images)
    return [np.sort(b) for b in np.array_split(order, n_images // size)]


def block_tables(factory: CoalitionUtility, kept: dict[str, Any], blocks: list[np.ndarray]
                 ) -> tuple[np.ndarray, float]:
    """``(B, 2^n)`` score sums, one row per block, and the seconds they took."""
    rows, started = [], time.perf_counter()
    for idx in blocks:
        utility = CoalitionUtility(factory.model, factory.x_eval[idx], factory.y_eval[idx],
                                   metric=factory.metric, device="cpu")
        game = utility(kept["global"], kept["states"], kept["num_examples"],
                       shares=kept["shares"])
        table, _ = table_of(game)
        rows.append(table * len(idx))
    return np.stack(rows), time.perf_counter() - started


def record(cell: Cell, factory: CapturingUtility, record_: dict[str, Any], size: int,
           seed: int) -> dict[str, Any]:
    """One game's block sums, whole-set table and metadata."""
    kept = factory.kept[cell.round]
    blocks = blocks_of(len(factory.y_eval), size, seed)
    sums, seconds = block_tables(factory, kept, blocks)
    sizes = [len(b) for b in blocks]
    meta = {"dataset": cell.dataset, "model": DATASETS[cell.dataset], "alpha": cell.alpha,
            "round": cell.round, "seed": cell.seed, "n": len(kept["states"]),
            "eval_size": int(sum(sizes)), "block_size": size, "block_seed": seed,
            "returned": record_.get("returned", []), "links": record_.get("links", []),
            "metric": factory.metric, "seconds_blocks": round(seconds, 2),
            "torch_threads": torch.get_num_threads()}
    return {"format": FORMAT, "utilities": f32(sums.sum(axis=0) / sum(sizes)),
            "block_sums": [f32(row) for row in sums], "block_sizes": sizes, "meta": meta}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="docs/results/eval-subsets/games")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--alphas", type=float, nargs="+", default=[0.1])
    p.add_argument("--rounds", type=int, nargs="+", default=[3, 10])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--block-size", type=int, default=50)
    p.add_argument("--block-seed", type=int, default=71)
    p.add_argument("--data-dir", default="", help="default: $FEDOWEN_DATA or ../shared/data")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = str(resolve_data_dir(args.data_dir or None))
    for dataset, alpha, seed in itertools.product(args.datasets, args.alphas, args.seeds):
        todo = [Cell(dataset, alpha, r, seed) for r in sorted(args.rounds)]
        todo = [c for c in todo if not (out / f"{c.key}.json.gz").exists()]
        if not todo:
            continue
        print(f"{dataset} alpha={alpha:g} seed={seed}: rounds {[c.round for c in todo]}",
              flush=True)
        cfg = run_config(dataset, alpha, seed, max(c.round for c in todo), data_dir)
        factory, records = play(cfg, {c.round for c in todo})
        for cell in todo:
            payload = record(cell, factory, records[cell.round], args.block_size,
                             args.block_seed)
            write_game(out / f"{cell.key}.json.gz", payload)
            meta = payload["meta"]
            print(f"  {cell.key}: n={meta['n']}, {len(payload['block_sizes'])} blocks, "
                  f"{meta['seconds_blocks']}s", flush=True)


if __name__ == "__main__":
    main()
