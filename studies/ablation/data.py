"""An ``ablation`` grid's cells as data: their metrics by variant and column, and the files.

:class:`AblationData` gathers the finished cells' metrics (final accuracy, mean of the last
rounds, largest weight, round costs); the report's files are drawn from it: accuracy and
largest-weight plots (one panel per column point), ``<grid>-rounds.csv.gz`` (every cell's
per-round data, so the plots can be redrawn without the raw results) and ``<grid>-summary.csv``
(the tables' numbers). The tables themselves are :mod:`studies.ablation.report`'s.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from sim.compact import open_csv, save_png
from sim.grid import Grid, Preset, expand_grid
from sim.results import (
    CellResult,
    grid_points,
    matches_point,
    planned_seeds,
    point_label,
)
from sim.stats import Interval, mean_interval, paired_interval

ROUND_FIELDS = ("variant", "column", "seed", "round", "test_accuracy", "max_weight",
                "num_returned", "round_seconds", "server_seconds")
SUMMARY_FIELDS = ("variant", "column", "metric", "n", "mean", "ci_half", "paired_n",
                  "paired_diff", "paired_ci_half", "paired_excludes_zero", "seeds", "values")


def max_weights(cell: CellResult) -> list[tuple[int, float]]:
    """(round, largest aggregation weight) of every aggregated round. A round whose weights
    were not finite (recorded as null, e.g. FLTrust's once its server update diverged) has
    none. A round carried from a committed report (``sim.carry``) has its ``max_weight``."""
    out = []
    for r in cell.rounds:
        ws = [w for w in (r.get("weights") or {}).values() if w is not None]
        if "max_weight" in r:
            ws = [r["max_weight"]]
        if r.get("round", 0) > 0 and ws:
            out.append((int(r["round"]), max(ws)))
    return out


def server_seconds(rec: dict[str, Any]) -> float | None:
    """The server's own work in a round: FedOwen's valuation (``valuation_seconds``; its
    weighted average is negligible beside it), or a peer or Flower strategy's aggregation
    (``aggregation_seconds``, FLTrust's root-set training included); a round carried from a
    committed report (``sim.carry``) has it as ``server_seconds``."""
    for key in ("valuation_seconds", "aggregation_seconds", "server_seconds"):
        if rec.get(key) is not None:
            return float(rec[key])
    return None


def round_costs(cell: CellResult) -> tuple[list[float], list[float]]:
    """(wall seconds of every training round, the server's own seconds of every round)."""
    rounds = [r for r in cell.rounds if r.get("round", 0) > 0]
    wall = [float(r["round_seconds"]) for r in rounds if r.get("round_seconds") is not None]
    server = [s for s in (server_seconds(r) for r in rounds) if s is not None]
    return wall, server


class AblationData:
    """The grid's finished-cell metrics by (variant, column label) -> {seed: value}."""

    def __init__(self, grid: Grid, preset: Preset, res: dict[str, CellResult]) -> None:
        self.grid, self.preset = grid, preset
        self.cols = grid_points(grid, grid.column_keys)
        self.rows = [p[grid.rows] for p in grid_points(grid, [grid.rows])]
        self.planned_cells = expand_grid(preset, grid)
        self.cells = [res[c.cell_id] for c in self.planned_cells]

    def planned(self, row: Any, col: dict[str, Any]) -> int:
        """How many seeds the grid plans for ``row`` at ``col`` (``extra`` may add some)."""
        return planned_seeds(self.planned_cells, {**col, self.grid.rows: row})

    def of(self, row: Any, col: dict[str, Any]) -> list[CellResult]:
        return [c for c in self.cells if matches_point(c.cell, {**col, self.grid.rows: row})]

    def by_seed(self, row: Any, col: dict[str, Any], metric: str) -> dict[int, float]:
        out = {}
        for cell in self.of(row, col):
            value = cell.final_accuracy() if metric == "final" else cell.last_k_accuracy()
            if value is not None:
                out[cell.cell.config.seed] = value
        return out

    def interval(self, row: Any, col: dict[str, Any], metric: str) -> Interval:
        return mean_interval(list(self.by_seed(row, col, metric).values()))

    def paired(self, row: Any, col: dict[str, Any], metric: str) -> Interval:
        return paired_interval(self.by_seed(row, col, metric),
                               self.by_seed(self.grid.reference, col, metric))


def plot_ablation(data: AblationData, path: Path, weights: bool) -> Path:
    """Accuracy (or largest weight) vs round per variant: mean and a light 95% CI band, both
    on the quantity's own range (a t-interval over 2 seeds reaches far beyond it)."""
    ncol = min(len(data.cols), 2)
    nrow = -(-len(data.cols) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.5 * ncol, 4.4 * nrow), squeeze=False,
                             layout="constrained")  # room for the suptitle
    # One colour per variant in every panel, the reference in black: matplotlib's default
    # cycle has 10 colours and would give an 11th variant the reference's.
    others = [r for r in data.rows if r != data.grid.reference]
    cmap = plt.get_cmap("tab10" if len(others) <= 10 else "tab20")
    colour: dict[Any, Any] = {r: cmap(i % cmap.N) for i, r in enumerate(others)}
    colour[data.grid.reference] = "black"
    for ax, col in zip(axes.flat, data.cols, strict=False):
        for row in data.rows:
            series = [max_weights(c) if weights else list(zip(*c.curve(), strict=True))
                      for c in data.of(row, col)]
            series = [s for s in series if s]
            if not series:
                continue
            n = max(len(s) for s in series)
            ys = np.full((len(series), n), np.nan)
            for i, s in enumerate(series):
                ys[i, :len(s)] = [v for _, v in s]
            x = np.array([r for r, _ in next(s for s in series if len(s) == n)])
            mean = np.nanmean(ys, axis=0)
            half = np.array([mean_interval(list(ys[:, j])).half for j in range(n)])
            (line,) = ax.plot(x, mean, label=str(row), color=colour.get(row),
                              lw=2.0 if row == data.grid.reference else 1.2)
            top = 1.0 if weights else 100.0  # the band is clipped to what the quantity can be
            ax.fill_between(x, np.clip(mean - half, 0, top), np.clip(mean + half, 0, top),
                            color=line.get_color(), alpha=0.1)
        ax.set_ylim(0, 1.0 if weights else 100.0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(title=point_label(col), xlabel="round",
               ylabel="largest aggregation weight" if weights else "test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    what = "largest aggregation weight" if weights else "test accuracy"
    fig.suptitle(f"{data.preset.name}: {what} vs round (mean over seeds, 95% CI band)")
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


def write_rounds_csv(data: AblationData, path: Path) -> Path:
    """Every cell's per-round accuracy and largest weight (the data behind the plots);
    gzip-compressed when ``path`` ends in ``.gz`` (:func:`sim.compact.open_csv`)."""
    with open_csv(path, "w") as fh:
        writer = csv.DictWriter(fh, fieldnames=ROUND_FIELDS)
        writer.writeheader()
        for col in data.cols:
            for row in data.rows:
                for cell in data.of(row, col):
                    weights = dict(max_weights(cell))
                    for rec in cell.rounds:
                        acc = rec.get("test_accuracy")
                        secs, own = rec.get("round_seconds"), server_seconds(rec)
                        writer.writerow({
                            "variant": row, "column": point_label(col),
                            "seed": cell.cell.config.seed,
                            "round": rec["round"],
                            "test_accuracy": "" if acc is None else round(100 * acc, 2),
                            "max_weight": round(weights[rec["round"]], 4)
                            if rec["round"] in weights else "",
                            "num_returned": rec.get("num_returned",
                                                    len(rec.get("returned") or [])),
                            "round_seconds": "" if secs is None else round(float(secs), 3),
                            "server_seconds": "" if own is None or not rec["round"]
                            else round(own, 3)})
    return path


def write_summary_csv(data: AblationData, path: Path) -> Path:
    """The tables' numbers: per variant, column and metric (``final`` or ``last``), the seeds'
    values, their mean and 95% CI half-width, and the paired difference against the reference
    with its half-width (empty for the reference itself)."""

    def num(x: float) -> Any:
        return "" if not np.isfinite(x) else round(x, 4)

    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=SUMMARY_FIELDS)
        writer.writeheader()
        for col in data.cols:
            for row in data.rows:
                for metric in ("final", "last"):
                    by_seed = data.by_seed(row, col, metric)
                    iv = data.interval(row, col, metric)
                    own = row == data.grid.reference
                    pd = data.paired(row, col, metric)
                    writer.writerow({
                        "variant": row, "column": point_label(col), "metric": metric, "n": iv.n,
                        "mean": num(iv.mean), "ci_half": num(iv.half),
                        "paired_n": "" if own else pd.n,
                        "paired_diff": "" if own else num(pd.mean),
                        "paired_ci_half": "" if own else num(pd.half),
                        "paired_excludes_zero": "" if own else pd.excludes_zero,
                        "seeds": " ".join(str(k) for k in sorted(by_seed)),
                        "values": " ".join(f"{by_seed[k]:.2f}" for k in sorted(by_seed))})
    return path
