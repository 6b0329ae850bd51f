"""Read a preset's results back from the per-round JSON lines and summarise them.

Only ``<results>/<cell-id>/rounds.jsonl`` is read: a cell counts as finished when its last
record is round ``num-server-rounds``; earlier records of an unfinished cell are kept for the
curves but not for the final-accuracy tables.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedowen_strategy.round.contribution import resolve_auto
from fedowen_strategy.selectors.shared import AUTO_CAP
from server_app.config import OPERATIONAL_KEYS, parse_run_config
from server_app.keys import defaults_hash
from server_app.store.records import read_rounds
from sim.cell_state import recorded_defaults
from sim.grid import RUNNER_KEYS, Cell, Grid, Preset, expand_grid, pin_auto_selection

#: Recorded config keys that differ between runs of one cell by design.
_PATH_FIELDS = ("output_dir", "data_dir", "resume_from")

#: A cell's rows carried from a committed report (``sim.carry``), when its records were lost.
CARRIED_FILE = "carried-rounds.csv"

#: Columns of a rounds CSV that are per-round values (the rest identify the cell).
_VALUES = ("round", "test_accuracy", "val_accuracy", "max_weight", "num_returned",
           "round_seconds", "server_seconds")

LAST_K = 5  # rounds averaged for the "mean of the last rounds" column


@dataclass(frozen=True)
class CellResult:
    """One cell and the rounds it recorded so far."""

    cell: Cell
    rounds: list[dict[str, Any]]

    @property
    def total_rounds(self) -> int:
        return self.cell.config.num_server_rounds

    @property
    def finished(self) -> bool:
        return bool(self.rounds) and self.rounds[-1].get("round") == self.total_rounds

    def curve(self, key: str = "test_accuracy") -> tuple[np.ndarray, np.ndarray]:
        """(round, accuracy in %) of every recorded round, round 0 included: test accuracy, or
        ``key = "val_accuracy"`` for the validation set's."""
        pts = [(r["round"], 100.0 * r[key]) for r in self.rounds if r.get(key) is not None]
        arr = np.array(pts, dtype=float).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def final_accuracy(self) -> float | None:
        """Test accuracy (%) after the last round, or None while unfinished."""
        return self.curve()[1][-1] if self.finished else None

    def last_k_accuracy(self, k: int = LAST_K, key: str = "test_accuracy") -> float | None:
        """Mean accuracy (%) of the last ``k`` rounds (less noisy than the final one)."""
        rounds, acc = self.curve(key)
        done = self.finished and bool(len(acc[rounds > 0]))
        return float(np.mean(acc[rounds > 0][-k:])) if done else None

    def valuation_seconds(self) -> list[float]:
        """Valuation wall time of every training round."""
        return [float(r["valuation_seconds"]) for r in self.rounds
                if r.get("round", 0) > 0 and r.get("valuation_seconds") is not None]


def _with_choices(fields: dict[str, Any], auto_selection: str = "") -> dict[str, Any]:
    """``fields`` (a ``config.json``, or a RunConfig as a dict) with ``auto`` selection (as
    ``auto_selection`` pins it: :func:`~sim.grid.pin_auto_selection`), aggregation, norm cap
    and identity cap resolved as they run; unchanged when it lacks what they resolve from."""
    fields = pin_auto_selection(fields, auto_selection)
    try:
        choices = resolve_auto(fields["valuation"], fields["selection"], fields["aggregation"],
                               fields["norm_cap"], fields.get("selection_cap", AUTO_CAP))
    except (KeyError, ValueError):
        return fields
    resolved = {"selection": choices.selection, "aggregation": choices.aggregation,
                "norm_cap": choices.norm_cap, "selection_cap": choices.cap}
    return {**fields, **{k: v for k, v in resolved.items() if k in fields}}


def config_drift(cell: Cell, recorded: dict[str, Any], auto_selection: str = ""
                 ) -> dict[str, tuple[Any, Any]]:
    """Settings a finished run recorded (its ``config.json``) that this checkout would resolve
    differently for the same cell, as ``{field: (recorded, now)}``; ``auto`` choices compared
    as they resolve (a recorded ``auto`` selection as its preset's ``auto_selection`` says).

    A cell id hashes only the keys its preset names, so when an app default changes, a cell
    that relied on it keeps its id and its old results: this says so. Fields the run did not
    record (added to the app later) are not compared."""
    recorded = _with_choices(recorded, auto_selection)
    now = _with_choices(asdict(parse_run_config({k: v for k, v in cell.run_config.items()
                                                 if k not in RUNNER_KEYS})))
    drift = {}
    for key, value in now.items():
        if key in _PATH_FIELDS or key not in recorded:
            continue
        value = json.loads(json.dumps(value))  # tuples as lists, as config.json holds them
        if recorded[key] != value:
            drift[key] = (recorded[key], value)
    return drift


def moved_defaults(cell: Cell, out: Path, auto_selection: str = ""
                   ) -> dict[str, tuple[Any, Any]]:
    """The learning keys whose default moved since the finished cell in ``out`` ran, as
    :func:`config_drift` says, when its record names other defaults than today's
    (:func:`server_app.keys.defaults_hash`); empty for a record without a hash (written before
    issue 61: it reads as it was written) or without a ``config.json``."""
    recorded = recorded_defaults(out)
    path = out / "config.json"
    if recorded is None or recorded == defaults_hash() or not path.exists():
        return {}
    drift = config_drift(cell, json.loads(path.read_text()), auto_selection)
    return {k: v for k, v in drift.items() if k.replace("_", "-") not in OPERATIONAL_KEYS}


def sweep_drift(preset: Preset, results: Path) -> dict[str, dict[str, tuple[Any, Any]]]:
    """:func:`config_drift` of every cell that recorded a ``config.json``, by cell id (cells
    without drift left out)."""
    out = {}
    for cell in preset.cells():
        path = results / cell.cell_id / "config.json"
        if path.exists():
            drift = config_drift(cell, json.loads(path.read_text()), preset.auto_selection)
            if drift:
                out[cell.cell_id] = drift
    return out


def drift_summary(drift: dict[str, dict[str, tuple[Any, Any]]]) -> str:
    """One line: how many cells ran with which settings this checkout resolves otherwise."""
    if not drift:
        return ""
    changes = Counter(f"{k} {json.dumps(old)} -> {json.dumps(new)}"
                      for d in drift.values() for k, (old, new) in d.items())
    what = "; ".join(f"{c} ({n} cells)" for c, n in sorted(changes.items()))
    return (f"{len(drift)} cells ran with settings this checkout resolves otherwise (an app "
            f"default changed since; their ids hash only the preset's keys): {what}. Their "
            "results stand for the code that ran them; pin the key in the preset to rerun.")


def carried_rounds(cell_dir: Path) -> list[dict[str, Any]]:
    """A carried cell's rows as round records: accuracies back as fractions (``test_accuracy``,
    ``val_accuracy``), ``round_seconds``, and the report's own derived columns under their CSV
    names (``max_weight``, ``num_returned``, ``server_seconds``), which the report reads when a
    record has no per-client weights. Empty when the cell was not carried."""
    path = cell_dir / CARRIED_FILE
    if not path.is_file():
        return []
    records = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            rec: dict[str, Any] = {"round": int(row["round"]), "carried": True}
            for key in _VALUES[1:]:
                text = row.get(key, "")
                if text == "":
                    continue
                value = float(text)
                if key.endswith("accuracy"):
                    value /= 100.0
                rec[key] = int(value) if key == "num_returned" else value
            records.append(rec)
    return records


def load_results(preset: Preset, results: Path) -> dict[str, CellResult]:
    """Every cell of the preset with whatever it recorded (possibly nothing), by cell id; a
    cell carried from a committed report (``sim.carry``) with the rows it carried."""
    return {c.cell_id: CellResult(c, read_rounds(results / c.cell_id)
                                  or carried_rounds(results / c.cell_id))
            for c in preset.cells()}


@dataclass(frozen=True)
class Stat:
    """Mean and sample std (percent) of one table entry over seeds."""

    values: tuple[float, ...]
    expected: int

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def std(self) -> float:
        return float(np.std(self.values, ddof=1)) if self.n > 1 else math.nan

    def text(self) -> str:
        """``84.12 ± 1.03``; ``n=2/3`` appended when seeds are missing; ``-`` when none."""
        if not self.values:
            return "-"
        std = "-" if math.isnan(self.std) else f"{self.std:.2f}"
        out = f"{self.mean:.2f} ± {std}"
        return out if self.n == self.expected else f"{out} (n={self.n}/{self.expected})"


def grid_points(grid: Grid, keys: list[str]) -> list[dict[str, Any]]:
    """All combinations of the grid's values of ``keys`` (axes order)."""
    values = [grid.axes[k] if k in grid.axes else [grid.fixed.get(k)] for k in keys]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def matches(cell: Cell, where: dict[str, Any]) -> bool:
    """Whether the cell's run config has every ``key = value`` of ``where``."""
    return all(_same(cell.run_config.get(k), v) for k, v in where.items())


def matches_point(cell: Cell, where: dict[str, Any]) -> bool:
    """:func:`matches`, but a grid-point key (e.g. ``variant``) is compared with the point."""
    return all(cell.point[k] == v if k in cell.point else _same(cell.run_config.get(k), v)
               for k, v in where.items())


def planned_seeds(cells: list[Cell], where: dict[str, Any]) -> int:
    """How many seeds a grid's ``cells`` plan at ``where`` (grid-point keys, e.g. a row and a
    column): the distinct seeds of its cells there (1 for a grid without a seed axis)."""
    return len({c.config.seed for c in cells if matches_point(c, where)}) or 1


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b))
    return bool(a == b)


def grid_stats(grid: Grid, preset: Preset, res: dict[str, CellResult], row_key: str,
               col_keys: list[str], metric: str = "final") -> dict[tuple[Any, ...], Stat]:
    """``{(row value, *column values): Stat}`` over the seeds of the grid's finished cells."""
    planned = expand_grid(preset, grid)
    cells = [res[c.cell_id] for c in planned]
    out = {}
    for row in grid_points(grid, [row_key]):
        for col in grid_points(grid, col_keys):
            where = {**row, **col}
            vals = [r.final_accuracy() if metric == "final" else r.last_k_accuracy()
                    for r in cells if matches(r.cell, where)]
            key = (row[row_key], *col.values())
            out[key] = Stat(tuple(v for v in vals if v is not None),
                            planned_seeds(planned, where))
    return out


def paper_value(grid: Grid, cell_where: dict[str, Any], row: Any) -> float | None:
    """The paper's number for row ``row`` at a column point, when the preset gives one."""
    for ref in grid.paper:
        if all(_same(cell_where.get(k, v), v) for k, v in ref.where.items()) and \
                str(row) in ref.values:
            return ref.values[str(row)]
    return None


def point_label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items()) or "all"


def markdown_table(stats: dict[tuple[Any, ...], Stat], rows: list[Any],
                   cols: list[dict[str, Any]], row_key: str) -> str:
    """A Markdown pivot (rows x column points) with the best mean of each column in bold."""
    head = f"| {row_key} | " + " | ".join(point_label(c) for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    best = []
    for col in cols:
        means = [stats[(r, *col.values())].mean for r in rows]
        finite = [m for m in means if not math.isnan(m)]
        best.append(max(finite) if finite else math.nan)
    for r in rows:
        cells = []
        for col, top in zip(cols, best, strict=True):
            st = stats[(r, *col.values())]
            text = st.text()
            cells.append(f"**{text}**" if st.n and math.isclose(st.mean, top) else text)
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
