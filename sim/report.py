"""Tables (Markdown, CSV) and plots (PNG) of a preset's results, from the JSON lines alone.

Per ``table`` grid: final test accuracy (%) as mean ± std over seeds with the best mean per
column in bold (the paper's format), the same for the mean of the last rounds, the paper's
numbers beside ours, valuation seconds per round, accuracy-vs-round curves. Per ``sweep``
grid: final accuracy against the swept value. Every other section (grids of the other kinds,
sections over the whole preset) is a study's, found through the table of :mod:`sim.sections`.
Everything lands in one folder with a README.md that links it all.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sim.archives import MANIFEST
from sim.carry import carried_summary
from sim.cell_state import cell_status, read_state
from sim.grid import Grid, Preset, expand_grid
from sim.plots import plot_curves, plot_sweep, plot_valuation_time
from sim.results import (
    LAST_K,
    CellResult,
    Stat,
    drift_summary,
    grid_points,
    grid_stats,
    load_results,
    markdown_table,
    matches,
    paper_value,
    point_label,
    sweep_drift,
)
from sim.sections import BUILT_IN, TABLE, GridSection, Part, Sections, load_sections

log = logging.getLogger(__name__)
CSV_FIELDS = ("grid", "metric", "row_key", "row", "columns", "n", "expected", "mean", "std",
              "values", "paper")


def paper_table(grid: Grid, preset: Preset, stats: dict[tuple[Any, ...], Stat],
                rows: list[Any], cols: list[dict[str, Any]]) -> str:
    """Ours (mean over seeds) beside the paper's number and the difference, per column."""
    head = "| method | " + " | ".join(f"{point_label(c)}: ours / paper / Δ" for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    for r in rows:
        cells = []
        for col in cols:
            st = stats[(r, *col.values())]
            ref = paper_value(grid, {**preset.base, **grid.fixed, **col}, r)
            ours = "-" if not st.n else f"{st.mean:.2f}"
            delta = "-" if (ref is None or not st.n) else f"{st.mean - ref:+.2f}"
            cells.append(f"{ours} / {'-' if ref is None else f'{ref:.2f}'} / {delta}")
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ranking_notes(stats: dict[tuple[Any, ...], Stat], rows: list[Any],
                  cols: list[dict[str, Any]], ours: str = "owen") -> list[str]:
    """Plain sentences: where ``ours`` is not the best mean, who beats it and by how much."""
    notes = []
    for col in cols:
        means = {r: stats[(r, *col.values())] for r in rows}
        if ours not in means or not means[ours].n:
            continue
        ranked = sorted((s.mean, r) for r, s in means.items() if s.n)[::-1]
        place = [r for _, r in ranked].index(ours) + 1
        if place > 1:
            better = ", ".join(f"{r} ({m:.2f})" for m, r in ranked[:place - 1])
            notes.append(f"{point_label(col)}: {ours} ranks {place} of {len(ranked)} "
                         f"({means[ours].mean:.2f}); better: {better}.")
        else:
            notes.append(f"{point_label(col)}: {ours} has the best mean "
                         f"({means[ours].mean:.2f}) of {len(ranked)} methods with results.")
    return notes


def valuation_table(grid: Grid, preset: Preset, res: dict[str, CellResult]) -> str:
    """Mean valuation seconds and utility calls per round, per row value (all cells pooled)."""
    lines = [f"| {grid.rows} | valuation s / round | utility calls / round | rounds |",
             "|---|---|---|---|"]
    for row in grid_points(grid, [grid.rows]):
        cells = [res[c.cell_id] for c in expand_grid(preset, grid) if matches(c, row)]
        secs = [s for r in cells for s in r.valuation_seconds()]
        evals = [rec.get("n_evals") or 0 for r in cells for rec in r.rounds if rec["round"] > 0]
        sec = f"{np.mean(secs):.2f}" if secs else "-"
        ev = f"{np.mean(evals):.1f}" if evals else "-"
        lines.append(f"| {row[grid.rows]} | {sec} | {ev} | {len(secs)} |")
    return "\n".join(lines)


def _csv_rows(grid: Grid, preset: Preset, metric: str, stats: dict[tuple[Any, ...], Stat],
              col_keys: list[str]) -> list[dict[str, Any]]:
    out = []
    for key, st in stats.items():
        col = dict(zip(col_keys, key[1:], strict=True))
        ref = paper_value(grid, {**preset.base, **grid.fixed, **col}, key[0])
        out.append({"grid": grid.name, "metric": metric, "row_key": grid.rows, "row": key[0],
                    "columns": point_label(col), "n": st.n, "expected": st.expected,
                    "mean": "" if not st.n else round(st.mean, 4),
                    "std": "" if math.isnan(st.std) else round(st.std, 4),
                    "values": " ".join(f"{v:.2f}" for v in st.values),
                    "paper": "" if ref is None else ref})
    return out


def split_tables(make: Callable[[list[dict[str, Any]]], str], cols: list[dict[str, Any]],
                 col_keys: list[str]) -> list[str]:
    """One table per value of the leading column keys when there are more than two (e.g. an
    ablation over imbalance factor x dataset x alpha gets one table per imbalance factor)."""
    split = col_keys[:-2]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for col in cols:
        groups.setdefault(tuple(col[k] for k in split), []).append(col)
    lines = []
    for key, members in groups.items():
        if split:
            lines += [f"*{point_label(dict(zip(split, key, strict=True)))}*", ""]
        table = make(members)
        if split:  # the table's title says the split values; drop them from the header
            header, rest = table.split("\n", 1)
            prefix = point_label(dict(zip(split, key, strict=True))) + ", "
            table = header.replace(prefix, "") + "\n" + rest
        lines += [table, ""]
    return lines


def grid_section(grid: Grid, preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    """Markdown lines, CSV rows and PNG files of one table or sweep grid."""
    col_keys = grid.column_keys if grid.kind == "table" else [grid.x, *grid.column_keys]
    rows = [p[grid.rows] for p in grid_points(grid, [grid.rows])]
    cols = grid_points(grid, col_keys)
    final = grid_stats(grid, preset, res, grid.rows, col_keys, "final")
    lastk = grid_stats(grid, preset, res, grid.rows, col_keys, "last-k")
    done = sum(res[c.cell_id].finished for c in expand_grid(preset, grid))
    total = len(expand_grid(preset, grid))
    md = [f"## {grid.name}", "", grid.description, "",
          f"Cells finished: {done} of {total}. Final test accuracy (%), mean ± std over seeds; "
          "best mean per column in bold.", "",
          *split_tables(lambda c: markdown_table(final, rows, c, grid.rows), cols, col_keys),
          f"Mean test accuracy (%) of the last {LAST_K} rounds (less sensitive to the "
          "round-to-round swings of a non-IID global model):", "",
          *split_tables(lambda c: markdown_table(lastk, rows, c, grid.rows), cols, col_keys)]
    if grid.paper:
        md += ["Ours (final accuracy, mean over seeds) vs the paper's number for the same cell "
               "(the paper: 100 rounds, 10 seeds):", "",
               *split_tables(lambda c: paper_table(grid, preset, final, rows, c), cols,
                             col_keys)]
    if grid.kind == "table" and "owen" in rows:
        md += ["Where FedOwen stands (final accuracy):", "",
               *[f"- {n}" for n in ranking_notes(final, rows, cols)], "",
               f"Where FedOwen stands (mean of the last {LAST_K} rounds):", "",
               *[f"- {n}" for n in ranking_notes(lastk, rows, cols)], ""]
    files = []
    if grid.kind == "table":
        md += ["Valuation cost (wall time on the machine that ran the cells; on a shared "
               "machine it follows the load more than the method, the utility-call count "
               "is the fair cost):", "", valuation_table(grid, preset, res), ""]
        files.append(plot_curves(grid, preset, res, out / f"{grid.name}-accuracy.png"))
        files.append(plot_valuation_time(grid, preset, res, out / f"{grid.name}-valuation.png"))
    else:
        files.append(plot_sweep(grid, final, rows, col_keys, out / f"{grid.name}.png"))
    md += [f"![{f.stem}]({f.name})" for f in files] + [""]
    csv_rows = (_csv_rows(grid, preset, "final", final, col_keys)
                + _csv_rows(grid, preset, f"last-{LAST_K}", lastk, col_keys))
    return Part(md, csv_rows, files)


def write_report(preset: Preset, results: Path, out: Path, command: str | None = None,
                 source: str | None = None, sections: Sections | None = None) -> list[Path]:
    """Write README.md, final_accuracy.csv and the PNGs of every grid to ``out``.

    ``source`` is the preset file as the commands should name it (default
    ``conf/<name>.toml``); ``command`` replaces the quoted run command. ``sections``: the
    sections beyond table and sweep grids (default: the table :func:`sim.sections.load_sections`
    reads)."""
    sections = load_sections() if sections is None else sections
    writers: dict[str, GridSection | None] = {kind: grid_section for kind in BUILT_IN}
    writers.update(sections.grids)
    missing = sorted({g.kind for g in preset.grids} - set(writers))
    if missing:
        raise ValueError(f"no report section for grid kind(s) {missing} of {preset.name}: name "
                         f"one in pyproject.toml's [{TABLE}.grids]")
    out.mkdir(parents=True, exist_ok=True)
    res = load_results(preset, results)
    done = sum(r.finished for r in res.values())
    parts = [Part(_header(preset, results, done, len(res), command, source))]
    parts += [section(preset, res, out) for section in sections.before]
    for grid in preset.grids:
        write = writers[grid.kind]
        if write is not None:  # None: a section after the grids writes this kind's grids
            parts.append(write(grid, preset, res, out))
    parts += [section(preset, res, out) for section in sections.after]
    with (out / "final_accuracy.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(row for part in parts for row in part.rows)
    (out / "README.md").write_text("\n".join(line for part in parts for line in part.lines)
                                   + "\n")
    log.info("report of %d/%d finished cells written to %s", done, len(res), out)
    return [out / "README.md", out / "final_accuracy.csv",
            *(f for part in parts for f in part.files)]


def _header(preset: Preset, results: Path, done: int, cells: int, command: str | None,
            source: str | None) -> list[str]:
    """The report's title, description and provenance lines (how it was produced, cells
    finished, reductions, carried rows, cells run with settings resolved otherwise today)."""
    source = source or f"conf/{preset.name}.toml"
    run_cmd = command or f"python -m sim.experiments run {source}"
    md = [f"# {preset.name}", "", preset.description, "",
          f"- Produced by: `{run_cmd}` then `python -m sim.experiments report {source}` "
          f"(regenerated from `results/{preset.name}/*/rounds.jsonl`).",
          f"- Cells finished: {done} of {cells}; {preset.num_supernodes} virtual clients.",
          f"- Reductions: {preset.reductions or 'none'}"]
    carried = carried_summary(preset, results)
    md += [f"- Carried: {carried}"] if carried else []
    drift = drift_summary(sweep_drift(preset, results))
    return md + ([f"- Code state: {drift}", ""] if drift else [""])


def report_refusal(preset: Preset, results: Path, out: Path) -> str | None:
    """Why writing ``results``' report over ``out`` would lose what ``out`` holds (a results
    folder that is missing, or has fewer finished cells than ``out``'s archive manifest
    lists: a mistyped ``--results`` would replace a committed report with an emptier one);
    None when it would not."""
    if not results.is_dir():
        return (f"results {results} not found: give --results the folder `run` wrote (or "
                "unpack a report's archive into it with `run --restore ... --limit 0`)")
    manifest = out / MANIFEST
    if not manifest.is_file():
        return None
    had = len(json.loads(manifest.read_text()).get("cells", []))
    state = read_state(results)
    done = sum(cell_status(results, c.cell_id, state.get(c.cell_id, [])) == "done"
               for c in preset.cells())
    if done >= had:
        return None
    return (f"{out} reports {had} archived cells ({MANIFEST}) and {results} has {done} "
            "finished: restore them first (`python -m sim.experiments run <its preset> --results "
            f"{results} --restore {out} --limit 0`), or pass --replace to write the smaller "
            "report")
