"""Baselines tuned on a validation split: a preset's ``tuning`` grids and their picks.

A ``tuning`` grid (``kind = "tuning"`` in a preset) runs every candidate (its ``rows`` axis,
usually ``variant``) on the tuning seeds with ``validation-fraction > 0``. A cell's score is
its **validation** accuracy averaged over the last :data:`~sim.results.LAST_K` rounds (rounds
96-100 of 100); a candidate's score is the mean of its seeds'; the pick is the best mean (a
tie goes to the candidate listed first). Test accuracy is never read here: the tuning table,
its CSVs and its plot show the validation set alone, so nothing tuned can have looked at the
numbers a confirmation is scored on.

Every grid point other than the rows and the seed is a column with a pick of its own. In the
second confirmation's presets, pairs of families name the better one (:data:`BETTER_OF`).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sim.compact import ROUNDS_SUFFIX, open_csv, save_png
from sim.grid import Grid, Preset, expand_grid
from sim.plots import mean_curve
from sim.results import LAST_K, CellResult, grid_points, matches_point
from sim.sections import Part
from sim.stats import Interval, mean_interval
from studies.confirmation.collapse import collapsed, floor_text
from studies.confirmation.protocol import SECOND_PRESET_PREFIX

VAL = "val_accuracy"


def tuning_scores(grid: Grid, preset: Preset, res: dict[str, CellResult], col: dict[str, Any]
                  ) -> dict[Any, dict[int, float]]:
    """``{candidate: {seed: validation accuracy (%) of its last rounds}}`` at column ``col``,
    finished cells only."""
    cells = [res[c.cell_id] for c in expand_grid(preset, grid)]
    scores: dict[Any, dict[int, float]] = {}
    for row in grid_points(grid, [grid.rows]):
        found = scores.setdefault(row[grid.rows], {})
        for r in cells:
            if matches_point(r.cell, {**col, **row}):
                value = r.last_k_accuracy(LAST_K, key=VAL)
                if value is not None:
                    found[r.cell.config.seed] = value
    return scores


def pick(scores: dict[Any, dict[int, float]], seeds: set[int]) -> Any:
    """The candidate with the best mean over seeds (the first listed on a tie); ``None``
    until every candidate has every one of the grid's tuning ``seeds``."""
    if not scores or not seeds or any(set(v) != seeds for v in scores.values()):
        return None
    means = {name: sum(v.values()) / len(v) for name, v in scores.items()}
    best = max(means.values())
    return next(name for name, m in means.items() if m == best)


def tuning_section(grid: Grid, preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    """Markdown lines and files (scores CSV, per-round CSV, validation curves PNG) of one
    tuning grid."""
    cols = grid_points(grid, grid.column_keys)
    planned = expand_grid(preset, grid)
    done = sum(res[c.cell_id].finished for c in planned)
    md = [f"## {grid.name}", "", grid.description, "",
          f"Cells finished: {done} of {len(planned)}. Validation accuracy (%) averaged over the "
          f"last {LAST_K} rounds, per tuning seed and mean ± 95% CI over them; the pick is the "
          "best mean (a tie: the first listed). Test accuracy is not read. **Bold**: a seed "
          f"collapsed, {floor_text(_datasets(planned), 'validation')}.", ""]
    score_rows: list[dict[str, Any]] = []
    for col in cols:
        scores = tuning_scores(grid, preset, res, col)
        chosen = pick(scores, {c.config.seed for c in planned})
        seeds = sorted({s for v in scores.values() for s in v})
        if col:
            md += [f"### {', '.join(f'{k}={v}' for k, v in col.items())}", ""]
        md += [f"| {grid.rows} | settings | " + " | ".join(f"seed {s}" for s in seeds)
               + " | mean ± CI | pick |",
               "|---|---|" + "---|" * len(seeds) + "---|---|"]
        dataset = next((str(c.run_config.get("dataset", "mnist")) for c in planned
                        if matches_point(c, col)), "")
        for name, by_seed in scores.items():
            interval = mean_interval(list(by_seed.values()))
            settings = _settings(preset, grid, name)
            md.append(f"| {name} | {settings} | "
                      + " | ".join(_pct(by_seed.get(s), dataset) for s in seeds)
                      + f" | {_text(interval)} | {'**picked**' if name == chosen else ''} |")
            score_rows += [{**col, grid.rows: name, "seed": s, "val_last5": f"{v:.4f}",
                            "picked": name == chosen} for s, v in sorted(by_seed.items())]
        md += ["", f"Pick: **{chosen}**" if chosen is not None
               else "Pick: none yet (every candidate needs every tuning seed).", ""]
    scores_csv = out / f"{grid.name}-validation.csv"
    _write_csv(scores_csv, score_rows, [*grid.column_keys, grid.rows, "seed", "val_last5",
                                        "picked"])
    rounds_csv = out / f"{grid.name}{ROUNDS_SUFFIX}"
    _write_csv(rounds_csv, _round_rows(grid, planned, res),
               [*grid.column_keys, grid.rows, "seed", "round", "val_accuracy"])
    png = plot_validation(grid, preset, res, out / f"{grid.name}-validation.png")
    md += [f"Scores: [{scores_csv.name}]({scores_csv.name}); per-round validation accuracy: "
           f"[{rounds_csv.name}]({rounds_csv.name}).", "", f"![{png.stem}]({png.name})", ""]
    return Part(md, files=[scores_csv, rounds_csv, png])


#: Pairs of tuning grids of which the second confirmation's report names the better family pick
#: (the higher score; on a tie the first listed): "the better of FedAvgM and FedProx" (rule 2 of
#: conf/confirm2/*.toml) and, where the selectors are tuned there, the better selector.
BETTER_OF = (("tune-fedavgm", "tune-fedprox"), ("tune-poc", "tune-oort"))


def family_pick(grid: Grid, preset: Preset, res: dict[str, CellResult], col: dict[str, Any]
                ) -> tuple[Any, float] | None:
    """A tuning grid's pick at column ``col`` and its score (mean validation accuracy over the
    tuning seeds); None until every candidate has every seed (:func:`pick`)."""
    scores = tuning_scores(grid, preset, res, col)
    chosen = pick(scores, {c.config.seed for c in expand_grid(preset, grid)})
    if chosen is None:
        return None
    return chosen, sum(scores[chosen].values()) / len(scores[chosen])


def better_of_sections(preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    """:func:`better_of_section` for every pair of :data:`BETTER_OF` the preset tunes (the
    report's section after the grids; ``out`` unused: no files)."""
    return Part([line for pair in BETTER_OF for line in better_of_section(preset, res, pair)])


def better_of_section(preset: Preset, res: dict[str, CellResult],
                      families: tuple[str, ...] = BETTER_OF[0]) -> list[str]:
    """Markdown lines: per column point, each family's pick with its score and the better
    family's pick; none until every family has its pick there. Empty when the preset lacks
    one of the families' grids or is not the second confirmation's (the first ran both)."""
    names = {g.name for g in preset.grids}
    if not preset.name.startswith(SECOND_PRESET_PREFIX) or not set(families) <= names:
        return []
    grids = [preset.grid(name) for name in families]
    md = [f"## The better of {' and '.join(families)}", "",
          "Per setting, each family's pick and its score (validation accuracy of the last "
          f"{LAST_K} rounds, mean over the tuning seeds); the better family's pick goes on (a "
          "tie: the first listed). Test accuracy is not read.", "",
          "| setting | " + " | ".join(families) + " | goes on |",
          "|---|" + "---|" * len(families) + "---|"]
    for col in grid_points(grids[0], grids[0].column_keys):
        picks = [family_pick(grid, preset, res, col) for grid in grids]
        done = [p for p in picks if p is not None]
        best = max(p[1] for p in done) if len(done) == len(picks) else None
        winner = next((p[0] for p in done if p[1] == best), None)
        setting = ", ".join(f"{k}={v}" for k, v in col.items()) or "-"
        md.append(f"| {setting} | "
                  + " | ".join("not yet" if p is None else f"{p[0]} ({p[1]:.2f})"
                               for p in picks)
                  + f" | {'**' + str(winner) + '**' if winner is not None else 'not yet'} |")
    return [*md, ""]


def _settings(preset: Preset, grid: Grid, name: Any) -> str:
    keys = preset.variants.get(str(name)) if grid.rows == "variant" else {grid.rows: name}
    return ", ".join(f"{k} = {v}" for k, v in (keys or {}).items())


def _pct(value: float | None, dataset: str = "") -> str:
    if value is None:
        return "-"
    return f"**{value:.2f}**" if collapsed(value, dataset, "validation") else f"{value:.2f}"


def _datasets(cells: list[Any]) -> list[str]:
    return sorted({str(c.run_config.get("dataset", "mnist")) for c in cells})


def _text(interval: Interval) -> str:
    return interval.text() if interval.n and not math.isnan(interval.mean) else "-"


def _round_rows(grid: Grid, planned: list[Any], res: dict[str, CellResult]
                ) -> list[dict[str, Any]]:
    rows = []
    for cell in planned:
        rounds, acc = res[cell.cell_id].curve(VAL)
        base = {k: cell.point.get(k) for k in grid.column_keys}
        base.update({grid.rows: cell.point.get(grid.rows), "seed": cell.config.seed})
        rows += [{**base, "round": int(r), "val_accuracy": f"{a:.2f}"}
                 for r, a in zip(rounds, acc, strict=True)]
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]], fields: list[str]) -> None:
    with open_csv(path, "w") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot_validation(grid: Grid, preset: Preset, res: dict[str, CellResult], path: Path) -> Path:
    """Validation accuracy vs round, one line per candidate (mean over the tuning seeds,
    ±1 std band), one panel per column point."""
    cols = grid_points(grid, grid.column_keys)
    fig, axes = plt.subplots(1, len(cols), figsize=(5.5 * len(cols), 4.2), squeeze=False,
                             layout="constrained")
    cells = [res[c.cell_id] for c in expand_grid(preset, grid)]
    for ax, col in zip(axes.flat, cols, strict=True):
        for row in grid_points(grid, [grid.rows]):
            x, mean, std = mean_curve([r for r in cells if matches_point(r.cell, {**col, **row})],
                                      key=VAL)
            if not len(x):
                continue
            (line,) = ax.plot(x, mean, label=str(row[grid.rows]), lw=1.4)
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.12)
        title = ", ".join(f"{k}={v}" for k, v in col.items()) or grid.name
        ax.set(title=title, xlabel="round", ylabel="validation accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{preset.name} / {grid.name}: validation accuracy (mean over tuning seeds, "
                 "±1 std)")
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path
