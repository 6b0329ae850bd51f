"""PNG plots of a preset's results (matplotlib, Agg backend): made from the JSON lines' data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from sim.compact import save_png
from sim.grid import Grid, Preset, expand_grid
from sim.results import CellResult, Stat, grid_points, matches


def _label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items()) or "all"


def mean_curve(cells: list[CellResult], key: str = "test_accuracy"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rounds, mean and std of test accuracy (or ``key``) per round over the cells that
    reached it (an unfinished seed contributes the rounds it has)."""
    curves = [c.curve(key) for c in cells if len(c.curve(key)[0])]
    if not curves:
        return np.array([]), np.array([]), np.array([])
    n = max(len(x) for x, _ in curves)
    ys = np.full((len(curves), n), np.nan)
    for i, (_, y) in enumerate(curves):
        ys[i, :len(y)] = y
    x = next(x for x, _ in curves if len(x) == n)
    return x, np.nanmean(ys, axis=0), np.nanstd(ys, axis=0)


def plot_curves(grid: Grid, preset: Preset, res: dict[str, CellResult], path: Path) -> Path:
    """Test accuracy vs round, one line per row value (mean over seeds, ±1 std band), one
    panel per column point."""
    cols = grid_points(grid, grid.column_keys)
    keys = grid.column_keys
    ncol = len(grid.axes[keys[-1]]) if keys else 1
    nrow = len(cols) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.5 * ncol, 4.2 * nrow), squeeze=False,
                             layout="constrained")  # room for the suptitle
    cells = [res[c.cell_id] for c in expand_grid(preset, grid)]
    for ax, col in zip(axes.flat, cols, strict=True):
        for row in grid_points(grid, [grid.rows]):
            x, mean, std = mean_curve([r for r in cells if matches(r.cell, {**col, **row})])
            if not len(x):
                continue
            (line,) = ax.plot(x, mean, label=str(row[grid.rows]),
                              lw=2.2 if row[grid.rows] == "owen" else 1.2)
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.12)
        ax.set(title=_label(col), xlabel="round", ylabel="test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{preset.name} / {grid.name}: accuracy vs round (mean over seeds, ±1 std)")
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_valuation_time(grid: Grid, preset: Preset, res: dict[str, CellResult],
                        path: Path) -> Path:
    """Valuation seconds per round per row value: mean bar, rounds' 10-90% range as error."""
    names, means, lo, hi = [], [], [], []
    for row in grid_points(grid, [grid.rows]):
        secs = [s for c in expand_grid(preset, grid) if matches(c, row)
                for s in res[c.cell_id].valuation_seconds()]
        if not secs:
            continue
        names.append(str(row[grid.rows]))
        m = float(np.mean(secs))
        means.append(m)
        # a few slow rounds can put the mean outside the 10-90% range: clip the bars at 0
        lo.append(max(0.0, m - float(np.percentile(secs, 10))))
        hi.append(max(0.0, float(np.percentile(secs, 90)) - m))
    fig, ax = plt.subplots(figsize=(1.1 * max(len(names), 3) + 2, 4))
    ax.bar(names, means, yerr=[lo, hi], capsize=4, color="tab:blue", alpha=0.8)
    for i, m in enumerate(means):
        ax.annotate(f"{m:.3g} s", (i, 0), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    ax.set(ylabel="valuation seconds per round", title=f"{grid.name}: valuation time "
           "(mean; bars: 10-90% of rounds)")
    ax.tick_params(axis="x", rotation=30)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(grid: Grid, stats: dict[tuple[Any, ...], Stat], rows: list[Any],
               col_keys: list[str], path: Path) -> Path:
    """Final accuracy vs the swept value (``grid.x``), one line per row value, std bars."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    xs = grid.axes[grid.x]
    numeric = all(isinstance(v, int | float) for v in xs)
    rest = [k for k in col_keys if k != grid.x]
    for row in rows:
        for other in grid_points(grid, rest):
            pts = [(x, stats[(row, *[(x if k == grid.x else other[k]) for k in col_keys])])
                   for x in xs]
            pts = [(x, s) for x, s in pts if s.n]
            if not pts:
                continue
            pos = [x if numeric else xs.index(x) for x, _ in pts]
            ax.errorbar(pos, [s.mean for _, s in pts],
                        yerr=[0.0 if np.isnan(s.std) else s.std for _, s in pts],
                        marker="o", capsize=3, label=" ".join(
                            [str(row), *[f"{k}={v}" for k, v in other.items()]]))
    if not numeric:
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set(xlabel=grid.x, ylabel="final test accuracy (%)",
           title=f"{grid.name}: final accuracy vs {grid.x}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path
