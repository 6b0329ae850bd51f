"""Where a selector's accuracy goes on a natural partition: writers it favours or neglects.

On FEMNIST (writers as clients) every FedOwen selector of the selection development grid ended
below random selection (docs/results/selection-dev/selection.md). This reads each finished
clean cell's final model (``final_model.pt``) on the official test split, grouped by writer:
every test image, those of the federation's writers (the 100 drawn as clients) and of the
others (writers no client holds), and two groups fixed by one **reference arm's** selection
counts in the same seed: the writers of the clients it selected most (top quartile of its
counts) and least (bottom quartile). Every arm is read on the same groups, so a difference on
the neglected writers is a difference on the same images.

An after-the-fact reading of development cells (exploratory); the final model is one round,
the grid's endpoint the mean of rounds 96-100, so the two differ by a round's noise. It needs
the cells' ``final_model.pt``, which the committed archives do not hold (they keep configs,
code records and per-round rows): from a fresh clone, rerun the grid's cells first.

    python -m studies.selection.writer_coverage conf/selection-dev.toml \\
        --results results/selection-dev --grid femnist --reference posterior-phi \\
        --out docs/results/selection-dev

writes ``writer-coverage-<reference>.csv`` (one row per cell) and ``.md`` (per arm: mean and
paired 95% CI against random selection, per group).
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from sim.presets import load_preset
from sim.results import CellResult, load_results
from sim.stats import paired_interval
from studies.selection.cells import selections
from studies.selection.development import RANDOM

GROUPS = ("all", "federation", "others", "favoured", "neglected")


def quartile_writers(counts: Mapping[int, int], client_writers: Sequence[int]
                     ) -> tuple[set[int], set[int]]:
    """Writers of the clients whose selection count is in the top and in the bottom quartile
    of ``counts`` (clients never selected count 0); ``client_writers[i]`` is client i's."""
    n = np.array([counts.get(i, 0) for i in range(len(client_writers))], dtype=float)
    hi, lo = np.quantile(n, 0.75), np.quantile(n, 0.25)
    favoured = {int(w) for w, c in zip(client_writers, n, strict=True) if c >= hi}
    neglected = {int(w) for w, c in zip(client_writers, n, strict=True) if c <= lo}
    return favoured, neglected


def group_accuracy(correct: NDArray[np.bool_], writers: NDArray[np.int64],
                   groups: Mapping[str, set[int] | None]) -> dict[str, float]:
    """Accuracy (%) over the images whose writer is in each group (None: every image); NaN
    for a group without images."""
    out = {}
    for name, members in groups.items():
        mask = (np.ones(writers.size, dtype=bool) if members is None
                else np.isin(writers, sorted(members)))
        out[name] = 100.0 * float(correct[mask].mean()) if mask.any() else float("nan")
    return out


def _correct(result: CellResult, results: Path, x: torch.Tensor, y: NDArray[np.int64],
             classes: int) -> NDArray[np.bool_]:
    """Which test images the cell's final model classifies right."""
    from fedowen_task.models import build_model

    model = build_model(result.cell.config.model, x.shape[1], classes)
    state = torch.load(results / result.cell.cell_id / "final_model.pt", map_location="cpu")
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + 2048]).argmax(1) for i in range(0, len(x), 2048)])
    return np.asarray(pred.numpy() == y)


def cell_rows(res: Mapping[str, CellResult], results: Path, grid: str, reference: str,
              clients: int) -> list[dict[str, Any]]:
    """One row per finished cell of ``grid`` (``clients`` in the federation): its arm, seed
    and accuracy per group."""
    from fedowen_task.data import load_dataset, to_tensor
    from fedowen_task.partition import federated_split

    cells = [r for r in res.values() if r.cell.grid == grid and r.finished]
    if not cells:
        raise SystemExit(f"no finished cell in grid {grid!r}: check --grid and --results")
    by_seed: dict[int, dict[str, CellResult]] = {}
    for r in cells:
        by_seed.setdefault(r.cell.config.seed, {})[str(r.cell.point["variant"])] = r
    cfg = cells[0].cell.config
    ds = load_dataset(cfg.dataset)
    if ds.writer_test is None:
        raise SystemExit(f"{cfg.dataset} has no per-image writers: use a writer-split grid")
    x, y = to_tensor(ds.x_test, ds.name), np.asarray(ds.y_test)
    writers, classes = np.asarray(ds.writer_test), int(np.max(ds.y_train)) + 1
    train_writers = np.asarray(ds.writer_train)
    rows = []
    for seed, arms in sorted(by_seed.items()):
        if reference not in arms:
            continue
        c = arms[reference].cell.config
        split = federated_split(ds, num_clients=clients, alpha=c.alpha,
                                imbalance_factor=c.imbalance_factor, seed=c.seed,
                                scheme=c.partition_scheme, min_size=c.min_partition_size,
                                eval_fraction=c.eval_fraction,
                                validation_fraction=c.validation_fraction)
        client_writers = [int(train_writers[p][0]) for p in split.client_idx]
        counts = {int(k): v for k, v in selections(arms[reference]).items()}
        favoured, neglected = quartile_writers(counts, client_writers)
        groups = {"all": None, "federation": set(client_writers),
                  "others": set(np.unique(writers).tolist()) - set(client_writers),
                  "favoured": favoured, "neglected": neglected}
        for arm, r in sorted(arms.items()):
            acc = group_accuracy(_correct(r, results, x, y, classes), writers, groups)
            rows.append({"arm": arm, "seed": seed, **{g: round(acc[g], 4) for g in GROUPS}})
    return rows


def markdown(rows: Sequence[dict[str, Any]], grid: str, reference: str) -> str:
    """Per arm and group: mean over seeds and the paired difference against random
    selection."""
    by_arm: dict[str, dict[str, dict[int, float]]] = {}
    for row in rows:
        for g in GROUPS:
            by_arm.setdefault(row["arm"], {}).setdefault(g, {})[row["seed"]] = row[g]
    lines = [f"# Writer coverage: {grid}, groups by {reference}'s selection counts",
             "", "Final-model test accuracy (%) per group of writers "
             "(studies/selection/writer_coverage.py; "
             "exploratory, read after the fact). `favoured` / `neglected`: writers of the "
             f"clients in the top / bottom quartile of {reference}'s selection counts in the "
             "same seed; every arm on the same images. Each cell: mean, then the paired "
             f"difference against {RANDOM} with its 95% CI. Read from the cells' final "
             "models, which are not committed (a rerun of the cells makes them again).", "",
             "| arm | seeds | " + " | ".join(GROUPS) + " |", "|---|---|" + "---|" * len(GROUPS)]
    for arm, per in by_arm.items():
        cells = []
        for g in GROUPS:
            mean = float(np.mean(list(per[g].values())))
            d = paired_interval(per[g], by_arm.get(RANDOM, {}).get(g, {}))
            cells.append(f"{mean:.2f} ({d.mean:+.2f} ± {d.half:.2f})" if arm != RANDOM
                         else f"{mean:.2f}")
        lines.append(f"| {arm} | {len(per['all'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.selection.writer_coverage",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", type=Path)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--grid", default="femnist")
    parser.add_argument("--reference", default="posterior-phi",
                        help="the arm whose selection counts fix the favoured/neglected groups")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    preset = load_preset(args.preset)
    rows = cell_rows(load_results(preset, args.results), args.results, args.grid,
                     args.reference, preset.num_supernodes)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"writer-coverage-{args.reference}"
    with stem.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["arm", "seed", *GROUPS])
        writer.writeheader()
        writer.writerows(rows)
    stem.with_suffix(".md").write_text(markdown(rows, args.grid, args.reference))
    print(f"[writer-coverage] {len(rows)} cells -> {stem}.csv, {stem}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
