"""``python -m studies.ablation.selection_sizes RESULTS_DIR [--out CSV]``: do a sweep's
selections favour clients with more (or fewer) examples?

A selection rule that prefers data-rich clients could explain an accuracy gain without any
valuation (sampling by size needs none), so the ablation reports this beside accuracy. Per
finished run (a dir with ``summary.json``): the partition sizes are recomputed from its
``config.json`` with :func:`fedowen_task.partition.federated_split` (the apps' own split, so
the dataset must be on disk) and compared with how often each client was selected:

- ``size_ratio``: mean partition size of the selected clients (over all selections) divided by
  the mean partition size; 1 = size-neutral (uniform selection), above 1 = favours data-rich
  clients;
- ``corr``: Pearson correlation of selection count with log partition size.

Runs are grouped by every run-config key except the seed (and the output dir); the table gives
each group's mean over seeds.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedowen_task.data import load_dataset
from fedowen_task.partition import federated_split
from server_app.store.records import read_rounds

#: Config keys that differ between runs of one setting without changing it.
_NOT_SETTING = ("seed", "output_dir", "data_dir", "resume_from")


def selection_counts(run_dir: Path, num_clients: int) -> np.ndarray:
    """How often each partition id was selected over the run's recorded rounds."""
    counts = np.zeros(num_clients)
    for rec in read_rounds(run_dir):
        for cid in rec.get("selected", []):
            counts[int(cid)] += 1
    return counts


def size_bias(sizes: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """(size_ratio, corr) as in the module docstring; NaN where undefined (no selections,
    or all sizes or all counts equal)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if sizes.shape != counts.shape:
        raise ValueError(f"sizes {sizes.shape} and counts {counts.shape} differ in shape")
    if counts.sum() <= 0:
        return float("nan"), float("nan")
    ratio = float((counts * sizes).sum() / counts.sum() / sizes.mean())
    logs = np.log(sizes)
    corr = (float(np.corrcoef(logs, counts)[0, 1]) if logs.std() > 0 and counts.std() > 0
            else float("nan"))
    return ratio, corr


def _setting(cfg: dict) -> str:
    return json.dumps({k: v for k, v in sorted(cfg.items()) if k not in _NOT_SETTING})


def sweep_bias(results: Path, num_clients: int, data_dir: str | None = None) -> list[dict]:
    """One row per setting: its varying keys, seeds, mean size_ratio and corr."""
    groups: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    configs: dict[str, dict] = {}
    datasets: dict[str, object] = {}
    for run in sorted(p for p in results.iterdir() if (p / "summary.json").exists()):
        cfg = json.loads((run / "config.json").read_text())
        name = cfg["dataset"]
        if name not in datasets:
            datasets[name] = load_dataset(name, data_dir or cfg.get("data_dir"))
        split = federated_split(datasets[name], num_clients=num_clients, alpha=cfg["alpha"],
                                imbalance_factor=cfg["imbalance_factor"], seed=cfg["seed"],
                                scheme=cfg["partition_scheme"],
                                min_size=cfg.get("min_partition_size", 10),
                                eval_fraction=cfg.get("eval_fraction", 0.01))
        ratio, corr = size_bias(split.sizes, selection_counts(run, num_clients))
        key = _setting(cfg)
        configs[key] = cfg
        groups[key].append((int(cfg["seed"]), ratio, corr))
    if not groups:
        return []
    # Only the keys that differ between settings name a row (keys some runs lack, from older
    # code, are left out of the name, not of the grouping).
    keys = sorted(set.intersection(*(set(cfg) for cfg in configs.values())) - set(_NOT_SETTING))
    varying = [k for k in keys if len({json.dumps(c.get(k)) for c in configs.values()}) > 1]
    rows = []
    for key, vals in groups.items():
        arr = np.array([(r, c) for _, r, c in vals])
        rows.append({**{k: configs[key].get(k) for k in varying},
                     "seeds": " ".join(str(s) for s, _, _ in sorted(vals)),
                     "size_ratio": round(float(np.nanmean(arr[:, 0])), 3),
                     "corr": round(float(np.nanmean(arr[:, 1])), 3)})
    return sorted(rows, key=lambda r: [str(r[k]) for k in varying])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.ablation.selection_sizes",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a sweep's results dir (one subdir per run)")
    ap.add_argument("--num-clients", type=int, default=100)
    ap.add_argument("--data-dir", default=None, help="default: each run's own data_dir")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as CSV")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        print(f"error: {args.results} is not a directory; pass a sweep's results dir",
              file=sys.stderr)
        return 2
    rows = sweep_bias(args.results, args.num_clients, args.data_dir)
    if not rows:
        print(f"error: no finished run (a dir with summary.json) under {args.results}",
              file=sys.stderr)
        return 2
    cols = list(rows[0])
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row[c]) for c in cols))
    if args.out:
        with args.out.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=cols)
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
