"""Report of an ``ablation`` grid: each variant against the grid's reference, paired by seed.

Per column point (e.g. alpha x partition scheme): final accuracy and the mean of the last rounds
as mean ± 95% CI over seeds; the **paired** difference of every variant against the reference
variant (same seeds, so same partitions and initial model) with its 95% CI; the largest
aggregation weight per round. Plots: accuracy vs round (mean, light 95% CI band) and largest
weight vs round, one panel per column point. ``<grid>-rounds.csv.gz`` holds every cell's per-round
data so the plots can be redrawn without the raw results; ``<grid>-summary.csv`` the numbers of
the tables (per variant, column and metric: seeds' values, mean and CI, paired difference and
CI). The cells' data and those files are :mod:`studies.ablation.data`'s; the tables, close calls and
the report's sections are here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim.compact import ROUNDS_SUFFIX
from sim.grid import Grid, Preset
from sim.results import LAST_K, CellResult, paper_value, point_label
from sim.sections import Part
from sim.stats import Interval
from studies.ablation.data import (
    AblationData,
    max_weights,
    plot_ablation,
    round_costs,
    write_rounds_csv,
    write_summary_csv,
)

#: Two rows whose mean final accuracies lie this close (points) are a close call, which
#: deserves :data:`CLOSE_SEEDS` seeds (issue 17: "5 where two defences are within 2 points").
CLOSE_MARGIN = 2.0
CLOSE_SEEDS = 5

def _table(data: AblationData, metric: str, paired: bool) -> list[str]:
    head = f"| {data.grid.rows} | " + " | ".join(point_label(c) for c in data.cols) + " |"
    lines = [head, "|" + "---|" * (len(data.cols) + 1)]
    for row in data.rows:
        if paired and row == data.grid.reference:
            continue
        cells = []
        for col in data.cols:
            iv = data.paired(row, col, metric) if paired else data.interval(row, col, metric)
            expected = data.planned(row, col)
            text = iv.text(signed=paired)
            if iv.n and iv.n < expected:  # say how many seeds, once
                text = text.replace(" (n=1)", "") + f" (n={iv.n}/{expected})"
            cells.append(f"**{text}**" if paired and iv.excludes_zero else text)
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def _weight_table(data: AblationData) -> list[str]:
    head = f"| {data.grid.rows} | " + " | ".join(point_label(c) for c in data.cols) + " |"
    lines = [head, "|" + "---|" * (len(data.cols) + 1)]
    for row in data.rows:
        cells = []
        for col in data.cols:
            ws = [w for cell in data.of(row, col) for _, w in max_weights(cell)]
            cells.append("-" if not ws else f"{np.median(ws):.2f} / {np.max(ws):.2f}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def _cost_table(data: AblationData) -> list[str]:
    """Per variant and column: mean wall seconds of a round, the server's own seconds of it,
    and the round's wall time as a multiple of the reference's (same sweep, same machine)."""
    head = f"| {data.grid.rows} | " + " | ".join(point_label(c) for c in data.cols) + " |"
    lines = [head, "|" + "---|" * (len(data.cols) + 1)]

    def pooled(row: Any, col: dict[str, Any]) -> tuple[list[float], list[float]]:
        costs = [round_costs(cell) for cell in data.of(row, col)]
        return [w for c in costs for w in c[0]], [s for c in costs for s in c[1]]

    ref_walls = [pooled(data.grid.reference, col)[0] for col in data.cols]
    for row in data.rows:
        cells = []
        for col, ref_wall in zip(data.cols, ref_walls, strict=True):
            wall, server = pooled(row, col)
            if not wall:
                cells.append("-")
                continue
            text = f"{np.mean(wall):.2f}"
            text += f" / {np.mean(server):.2f}" if server else " / -"
            if ref_wall and row != data.grid.reference:
                text += f" ({np.mean(wall) / np.mean(ref_wall):.2f}x)"
            cells.append(text)
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def _paper_lines(data: AblationData) -> list[str]:
    lines = []
    for col in data.cols:
        where = {**data.preset.base, **data.grid.fixed, **col}
        for row in data.rows:
            ref = paper_value(data.grid, where, row)
            if ref is not None:
                ours = data.interval(row, col, "final")
                lines.append(f"- {point_label(col)}, {row}: ours {ours.text()}, paper {ref:.2f}")
    return lines


def close_calls(data: AblationData, margin: float = CLOSE_MARGIN
                ) -> list[tuple[dict[str, Any], list[tuple[Any, float, int]]]]:
    """Columns where another row's mean final accuracy (over finished seeds) lies within
    ``margin`` points of the best's: (column, [(row, points below the best, seeds), ...]),
    the best row first (0 points below)."""
    out = []
    for col in data.cols:
        means = []
        for row in data.rows:
            iv = data.interval(row, col, "final")
            if iv.n:
                means.append((iv.mean, row, iv.n))
        means.sort(key=lambda t: -t[0])
        near = [(row, means[0][0] - m, n) for m, row, n in means if means[0][0] - m <= margin]
        if len(near) >= 2:
            out.append((col, near))
    return out


def _close_lines(data: AblationData) -> list[str]:
    calls = close_calls(data)
    if not calls:
        return []
    lines = [f"Close calls (rows within {CLOSE_MARGIN:g} points of the column's best final "
             f"accuracy; such rows deserve {CLOSE_SEEDS} seeds):", ""]
    for col, near in calls:
        best, *rest = near
        wanted = any(n < CLOSE_SEEDS for _, _, n in near)
        lines.append(f"- {point_label(col)}: `{best[0]}` ({best[2]} seeds) best; "
                     + ", ".join(f"`{row}` {gap:.2f} points below ({n} seeds)"
                                 for row, gap, n in rest)
                     + (" (more seeds wanted)" if wanted else ""))
    return [*lines, ""]


def _seeds_text(iv: Interval, base_n: int) -> str:
    """The interval, with its seed count where it is not the grid's usual ``base_n``."""
    text = iv.text()
    return text if iv.n in (0, 1, base_n) else f"{text} (n={iv.n})"


def overview_section(preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    """One table per value of the column key every ablation grid shares (e.g. ``alpha``):
    rows the grids' rows (e.g. defences), columns every grid's other column points (e.g.
    attacks), final accuracy with its 95% CI, the best of each column in bold; then each
    row's round wall time as a multiple of the reference's, pooled over every column.
    Empty unless at least two ablation grids share their rows and reference."""
    grids = [g for g in preset.grids if g.kind == "ablation"]
    if len(grids) < 2 or len({(g.rows, g.reference) for g in grids}) > 1:
        return Part([])
    datas = [AblationData(g, preset, res) for g in grids]
    rows = list(dict.fromkeys(r for d in datas for r in d.rows))
    shared = [k for k in grids[0].column_keys if all(k in g.column_keys for g in grids[1:])]
    split = shared[-1] if shared else ""  # "" = no shared key: one table

    def split_value(col: dict[str, Any]) -> Any:
        return col.get(split) if split else None

    values = list(dict.fromkeys(split_value(c) for d in datas for c in d.cols))
    md = ["## Overview", "",
          f"Final test accuracy (%) of every `{grids[0].rows}` under every grid's setting, "
          "mean ± 95% CI half-width over seeds (best per column in bold; the per-grid "
          "sections below have paired differences and last-5-round means):", ""]
    for value in values:
        cols = [(d, c) for d in datas for c in d.cols if split_value(c) == value]
        heads = [f"{d.grid.name}" + "".join(f", {v}" for k, v in c.items() if k != split)
                 for d, c in cols]
        if split:
            md += [f"{split} = {value}:", ""]
        md += [f"| {grids[0].rows} | " + " | ".join(heads) + " |",
               "|" + "---|" * (len(cols) + 1)]
        ivs = [[d.interval(row, c, "final") if row in d.rows else None for d, c in cols]
               for row in rows]
        best = [max((iv.mean for iv in column if iv is not None and iv.n), default=None)
                for column in zip(*ivs, strict=True)]
        base_n = [len(d.grid.axes.get("seed", [0])) for d, _ in cols]
        for row, line in zip(rows, ivs, strict=True):
            texts = [("-" if iv is None else f"**{_seeds_text(iv, n)}**"
                      if iv.n and iv.mean == top else _seeds_text(iv, n))
                     for iv, top, n in zip(line, best, base_n, strict=True)]
            md.append(f"| {row} | " + " | ".join(texts) + " |")
        md.append("")
    ref = grids[0].reference
    walls = {row: [w for d in datas for c in d.cols for cell in d.of(row, c)
                   for w in round_costs(cell)[0]] for row in rows}
    if walls.get(ref):
        md += [f"Round wall time as a multiple of `{ref}`'s, pooled over every cell above "
               "(same sweep, same machine): " + ", ".join(
                   f"{row} {np.mean(walls[row]) / np.mean(walls[ref]):.2f}x"
                   for row in rows if row != ref and walls[row]) + ".", ""]
    return Part(md)


def ablation_section(grid: Grid, preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    """Markdown lines and files (PNGs, rounds CSV) of one ablation grid."""
    data = AblationData(grid, preset, res)
    done = sum(c.finished for c in data.cells)
    ref = grid.reference
    md = [f"## {grid.name}", "", grid.description, "",
          f"Cells finished: {done} of {len(data.cells)}. Mean ± half-width of the 95% "
          "Student-t confidence interval over seeds.", "",
          "Final test accuracy (%):", "", *_table(data, "final", False), "",
          f"Mean test accuracy (%) of the last {LAST_K} rounds:", "",
          *_table(data, "last", False), "",
          f"Paired difference against `{ref}` (percentage points, same seeds; bold where the "
          "95% CI excludes 0), final accuracy:", "", *_table(data, "final", True), "",
          f"The same, mean of the last {LAST_K} rounds:", "", *_table(data, "last", True), "",
          "Largest aggregation weight of a round (median / max over rounds and seeds):", "",
          *_weight_table(data), "",
          "Cost per round, seconds (mean over rounds and seeds): the whole round's wall time / "
          "the server's own work in it (FedOwen's valuation; a peer's or Flower strategy's "
          f"aggregation, FLTrust's root-set training included); in brackets the round's wall "
          f"time as a multiple of `{ref}`'s, measured in the same sweep on the same machine "
          "(cells ran side by side, so absolute times carry the machine's load):", "",
          *_cost_table(data), "", *_close_lines(data)]
    paper = _paper_lines(data)
    if paper:
        md += ["The paper's numbers for the same cells (100 rounds, 10 seeds):", "", *paper, ""]
    files = [plot_ablation(data, out / f"{grid.name}-accuracy.png", weights=False),
             plot_ablation(data, out / f"{grid.name}-max-weight.png", weights=True),
             write_rounds_csv(data, out / f"{grid.name}{ROUNDS_SUFFIX}"),
             write_summary_csv(data, out / f"{grid.name}-summary.csv")]
    md += [f"![{f.stem}]({f.name})" for f in files[:2]]
    md += ["", f"Per-round data: [{files[2].name}]({files[2].name}); the tables' numbers: "
           f"[{files[3].name}]({files[3].name}).", ""]
    return Part(md, files=files)
