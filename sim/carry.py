"""Carry a committed report's per-round rows back into a results dir as finished cells.

A report commits every cell's per-round rows (``<grid>-rounds.csv.gz``, or a plain
``<grid>-rounds.csv`` from before the CSVs were compressed); the cells' own records
(``rounds.jsonl``) travel in an archive. Until issue 44 an archive over 1 MB lived in the
archive store (:func:`sim.archives.archive_store`), which is one machine's disk: when that
machine was gone, so were the records, while the rows the report was written from are still in
git. A
preset that is still running (the confirmation) would otherwise have to rerun every finished
cell, hours of compute that reproduce those rows bit for bit, before its report could grow.

:func:`carry_rows` writes, for every finished cell in the committed CSV that the results dir
lacks, ``<cell id>/carried-rounds.csv`` (the cell's rows, unchanged) and a ``summary.json``
naming the CSV and the commit it came from. The runner then counts the cell as done, the
report reads its rows back (:func:`sim.results.carried_rounds`) and writes them out again
unchanged, and the cell archive carries them on. A report's records archive
(:data:`RECORDS`, in git whatever the size of the full archive) gives each carried cell its
``config.json`` and ``code.json`` back, so a protocol's check of its cells reads them as for a
cell that ran here. What is lost stays lost and is said (:func:`carried_summary`, in the report's
header): per-client records (attack costs, payouts), accuracy beyond two decimals, and the
config of a cell whose report kept no records archive (``check`` counts those).
"""

from __future__ import annotations

import csv
import json
import subprocess
import tarfile
from collections import defaultdict
from pathlib import Path

from sim.cell_state import CODE_FILE, SUMMARY_FILE
from sim.compact import open_csv, rounds_file
from sim.grid import Cell, Grid, Preset, expand_grid
from sim.results import CARRIED_FILE, point_label

#: Beside a report (``report --archive``): every finished cell's config and code record, small
#: enough for git whatever the size of the full archive.
RECORDS = "cells-records.tar.gz"
RECORDED = ("config.json", CODE_FILE, SUMMARY_FILE)
_CHECKED = RECORDED[:2]  # what a carried cell takes from the records: what `check` reads


def cell_key(grid: Grid, cell: Cell) -> tuple[str, ...]:
    """How a grid's rounds CSV names a cell: (row value, column label, seed) for an ablation
    grid, (row value, column values..., seed) for a tuning grid, every part as the CSV of the
    kind's report section writes it (the format is the harness's: carry reads it back)."""
    row = str(cell.point.get(grid.rows))
    if grid.kind == "ablation":
        label = point_label({k: cell.point[k] for k in grid.column_keys})
        return row, label, str(cell.config.seed)
    return (row, *(str(cell.point.get(k)) for k in grid.column_keys), str(cell.config.seed))


def _row_key(grid: Grid, row: dict[str, str]) -> tuple[str, ...]:
    if grid.kind == "ablation":
        return row["variant"], row["column"], row["seed"]
    return (row[grid.rows], *(row[k] for k in grid.column_keys), row["seed"])


def committed_at(path: Path) -> str | None:
    """The last commit that changed ``path`` (None outside git or when never committed)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%H", "--", path.name],
                             cwd=path.parent, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def carry_rows(preset: Preset, report_dir: Path, results: Path) -> dict[str, int]:
    """Carry every finished cell of the committed ``report_dir/<grid>-rounds.csv.gz`` files
    (or plain ``.csv``: :func:`sim.compact.rounds_file`) into ``results`` where it has no
    finished cell of its own; returns ``{grid: cells carried}``.

    A cell is finished in the CSV when its rows reach round ``num-server-rounds``; a cell
    already in ``results`` (run, restored or carried before) is never touched.
    """
    carried: dict[str, int] = {}
    records = _records(report_dir / RECORDS)
    for grid in preset.grids:
        source = rounds_file(report_dir, grid.name)
        if grid.kind not in ("ablation", "tuning") or source is None:
            continue
        with open_csv(source) as fh:
            reader = csv.DictReader(fh)
            fields = list(reader.fieldnames or [])
            groups: dict[tuple[str, ...], list[dict[str, str]]] = defaultdict(list)
            for row in reader:
                groups[_row_key(grid, row)].append(row)
        commit = committed_at(source)
        carried[grid.name] = 0
        for cell in expand_grid(preset, grid):
            rows = groups.get(cell_key(grid, cell), [])
            out = results / cell.cell_id
            last = int(rows[-1]["round"]) if rows else -1
            if last != cell.config.num_server_rounds or (out / SUMMARY_FILE).exists():
                continue
            out.mkdir(parents=True, exist_ok=True)
            with (out / CARRIED_FILE).open("w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=fields)
                writer.writeheader()
                writer.writerows(rows)
            (out / SUMMARY_FILE).write_text(json.dumps(
                {"carried_from": source.name, "report": report_dir.name,
                 "commit": commit, "rounds": last}, indent=1) + "\n")
            for name, data in records.get(cell.cell_id, {}).items():
                (out / name).write_bytes(data)
            carried[grid.name] += 1
    return carried


def _records(path: Path) -> dict[str, dict[str, bytes]]:
    """``{cell id: {file name: bytes}}`` of a :data:`RECORDS` archive (empty when there is
    none): the config and code records a carried cell takes along."""
    if not path.is_file():
        return {}
    out: dict[str, dict[str, bytes]] = defaultdict(dict)
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            cell, _, name = member.name.partition("/")
            data = tar.extractfile(member) if member.isfile() and name in _CHECKED else None
            if data is not None:
                out[cell][name] = data.read()
    return out


def is_carried(cell_dir: Path) -> bool:
    """Whether the cell's records are rows carried from a committed report."""
    return (cell_dir / CARRIED_FILE).is_file()


def carried_summary(preset: Preset, results: Path) -> str:
    """One line: which cells the report reads from carried rows, from which committed CSV and
    commit, and what that costs them ("" when none)."""
    sources: dict[str, int] = defaultdict(int)
    unchecked = 0
    for cell in preset.cells():
        out = results / cell.cell_id
        if is_carried(out):
            meta = json.loads((out / SUMMARY_FILE).read_text())
            commit = (meta.get("commit") or "uncommitted")[:7]
            sources[f"docs/results/{meta['report']}/{meta['carried_from']} at {commit}"] += 1
            unchecked += not (out / "config.json").exists()
    if not sources:
        return ""
    what = "; ".join(f"{n} from {src}" for src, n in sorted(sources.items()))
    records = (f"{unchecked} of them have no config.json to check again (checked when their "
               "rows were committed); the others kept theirs in the report's "
               f"{RECORDS}") if unchecked else f"their config and code records came from {RECORDS}"
    return (f"{sum(sources.values())} cells are their committed per-round rows, carried "
            f"(`run --carry`) after their run records were lost: {what}. Their accuracy has "
            "two decimals (a CI half-width may move by 0.01, a tuning score loses its last "
            f"digits); they have no per-client records; {records}.")
