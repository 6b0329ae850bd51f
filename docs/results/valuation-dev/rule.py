"""valuation-dev's rule (conf/valuation-dev.toml, steps 1-3) on its 75 cells: validation decides,
paired by seed; test accuracy, the valuation's share of a round and first-order are reported.

    python rule.py RESULTS OUT        # RESULTS: the preset's results folder (the cells' records)

Writes OUT/cells.csv.gz (one row a cell: its scores and config keys) and prints the tables.
"""

import csv
import gzip
import json
import math
import statistics
import sys
from pathlib import Path

from sim.stats import paired_interval

SETTINGS = [("mnist", 0.01), ("mnist", 0.1), ("fashion-mnist", 0.01), ("fashion-mnist", 0.1),
            ("cifar10", 0.1)]
ARMS = {"owen-antithetic": "owen", "first-order-simpson": "simpson", "first-order": "first-order"}
SEEDS = [0, 1, 2, 3, 4]


def cell_scores(folder: Path) -> dict:
    """A finished cell's config keys and scores (validation and test: mean of rounds 96-100 in
    points; share: median over rounds 2-100 of valuation_seconds / round_seconds)."""
    cfg = json.loads((folder / "config.json").read_text())
    rows = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    last = [r for r in rows if 96 <= r["round"] <= 100]
    assert len(last) == 5, (folder.name, len(last))
    shares = [r["valuation_seconds"] / r["round_seconds"] for r in rows
              if r["round"] >= 2 and r.get("round_seconds")]
    attempts = json.loads((folder / "code.json").read_text())
    kernels = (attempts[-1].get("machine") or {}).get("kernels", "")
    return {"cell": folder.name, "kernels": kernels, "dataset": cfg["dataset"],
            "alpha": cfg["alpha"],
            "arm": ARMS[cfg["valuation"]], "seed": cfg["seed"],
            "val": 100 * statistics.mean(r["val_accuracy"] for r in last),
            "test": 100 * statistics.mean(r["test_accuracy"] for r in last),
            "share": statistics.median(shares)}


def paired(score: dict, setting, a: str, b: str, metric: str, seeds) -> tuple[float, float, float]:
    """Mean of metric(a) - metric(b) over seeds and its 95% t-interval."""
    iv = paired_interval({s: score[(setting, a, s)][metric] for s in seeds},
                         {s: score[(setting, b, s)][metric] for s in seeds})
    return iv.mean, iv.lo, iv.hi


def first_order(score: dict, setting, against: str) -> str:
    """first-order - ``against`` on validation over the seeds first-order has finished."""
    seeds = [k for k in SEEDS if (setting, "first-order", k) in score]
    if len(seeds) < 2:
        return f"({len(seeds)} of 5 seeds run)"
    m, lo, hi = paired(score, setting, "first-order", against, "val", seeds)
    note = "" if len(seeds) == len(SEEDS) else f" ({len(seeds)} seeds)"
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]{note}"


def verdict(score: dict, seeds) -> tuple[bool, list]:
    """Step 2's grid half: simpson's interval's upper bound >= 0 in every setting."""
    losing = [s for s in SETTINGS if paired(score, s, "simpson", "owen", "val", seeds)[2] < 0]
    return not losing, losing


def main() -> None:
    results, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows = [cell_scores(p) for p in sorted(results.iterdir()) if (p / "summary.json").exists()]
    deciding = [r for r in rows if r["arm"] != "first-order"]
    assert len(deciding) == 50, len(deciding)  # first-order (reported) may be partial
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "cells.csv.gz", "wt", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["dataset"], r["alpha"], r["arm"],
                                                     r["seed"])))
    score = {((r["dataset"], r["alpha"]), r["arm"], r["seed"]): r for r in rows}
    print("| setting | owen val | simpson val | d = simpson - owen, val [95% CI] "
          "| d, test [95% CI] | first-order - owen, val | first-order - simpson, val "
          "| share of a round: owen / simpson / first-order |")
    print("|---|---:|---:|---|---|---|---|---|")
    for s in SETTINGS:
        mean = {a: statistics.mean(score[(s, a, k)]["val"] for k in SEEDS)
                for a in ("owen", "simpson")}
        share = {a: 100 * statistics.median(v) if (v := [score[(s, a, k)]["share"] for k in SEEDS
                                                         if (s, a, k) in score]) else math.nan
                 for a in ARMS.values()}
        fmt = "{:+.2f} [{:+.2f}, {:+.2f}]".format
        print(f"| {s[0]} a{s[1]} | {mean['owen']:.2f} | {mean['simpson']:.2f} "
              f"| {fmt(*paired(score, s, 'simpson', 'owen', 'val', SEEDS))} "
              f"| {fmt(*paired(score, s, 'simpson', 'owen', 'test', SEEDS))} "
              f"| {first_order(score, s, 'owen')} | {first_order(score, s, 'simpson')} "
              f"| {share['owen']:.0f}% / {share['simpson']:.0f}% / {share['first-order']:.0f}% |")
    straddle = [(s, k) for s in SETTINGS for k in SEEDS
                if score[(s, "owen", k)]["kernels"] != score[(s, "simpson", k)]["kernels"]]
    print(f"\nPairs whose two arms ran on CPUs of other kernel flags (AVX2 kernels pinned on "
          f"both): {len(straddle)} of {len(SETTINGS) * len(SEEDS)} {straddle or ''}")
    held, losing = verdict(score, SEEDS)
    print(f"\nStep 2, the grid's half: {'holds' if held else 'fails'}"
          + ("" if held else f" (simpson loses beyond the CI in {losing})"))
    for out_seed in SEEDS:
        keep = [k for k in SEEDS if k != out_seed]
        ok, lost = verdict(score, keep)
        print(f"  without seed {out_seed}: {'holds' if ok else 'fails ' + str(lost)}")


if __name__ == "__main__":
    main()
