"""Experiment grids: a validated preset's types, and its cells with stable ids.

A preset (:mod:`sim.presets` reads and validates the TOML file) holds ``base`` run-config keys,
named ``variants`` and grids. A cell is one run: ``base`` + the grid's ``set`` + one point of
its ``axes`` (a ``variant`` value expands to its run-config keys) + the ``overrides`` that name
that point. A grid's ``extra`` adds the products of ``axes`` with some value lists replaced,
e.g. two more seeds for the two rows of one column that lie too close to call: the tables keep
the grid's rows and columns and count each entry's seeds from its own cells. A cell's id is a
hash of that run config (without paths, which differ between machines) and the simulation
settings, so the same cell has the same id in every preset, on every machine and under either
backend.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from fedowen_strategy.round.round_valuers import NO_PHI
from server_app.config import RunConfig, parse_run_config

BACKENDS = ("flwr", "inline")
VARIANT = "variant"
KINDS = ("table", "sweep", "adversarial", "ablation", "tuning")
# Keys the runner owns (paths are per machine; resume-from is how a cell continues).
RUNNER_KEYS = ("output-dir", "resume-from", "data-dir")


@dataclass(frozen=True)
class PaperRef:
    """The paper's reported accuracies (percent) of the rows at one column point."""

    where: dict[str, Any]
    values: dict[str, float]


@dataclass(frozen=True)
class Grid:
    """One table, sweep or ablation of a preset."""

    name: str
    kind: str
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    rows: str
    x: str = ""
    paper: tuple[PaperRef, ...] = ()
    description: str = ""
    reference: str = ""
    extra: tuple[dict[str, list[Any]], ...] = ()
    overrides: tuple[dict[str, dict[str, Any]], ...] = ()

    @property
    def column_keys(self) -> list[str]:
        """Axes that are neither the row key, the sweep variable nor the seed."""
        return [k for k in self.axes if k not in (self.rows, self.x, "seed")]


@dataclass(frozen=True)
class Cell:
    """One ``flwr run`` of a preset."""

    cell_id: str
    grid: str
    run_config: dict[str, Any]
    point: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """Short human-readable description of the point, e.g. ``valuation=owen alpha=0.01``."""
        return " ".join(f"{k}={v}" for k, v in self.point.items())

    @property
    def config(self) -> RunConfig:
        """The cell's run config as the app reads it (every key, defaults the app's)."""
        return app_config(self.run_config)


def app_config(run_config: Mapping[str, Any]) -> RunConfig:
    """``run_config`` (kebab-case keys, as a preset or a cell holds it) through the app's own
    type, so experiment code never restates a key's default."""
    return _parsed(json.dumps({k: v for k, v in run_config.items() if k not in RUNNER_KEYS},
                              sort_keys=True))


@lru_cache(maxsize=4096)
def _parsed(text: str) -> RunConfig:
    return parse_run_config(json.loads(text))


@dataclass(frozen=True)
class Preset:
    """A parsed, validated preset file."""

    name: str
    description: str
    num_supernodes: int
    cpus_per_client: float
    cell_timeout: float
    base: dict[str, Any]
    grids: tuple[Grid, ...]
    reductions: str = ""
    backend: str = "flwr"
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: What ``auto`` selection meant when this preset's cells ran (``[preset]
    #: auto-selection``; empty: today's meaning): :func:`pin_auto_selection`.
    auto_selection: str = ""

    def cells(self) -> list[Cell]:
        """Every cell of every grid (a cell shared by two grids appears once), seed by seed:
        all seed-0 cells in file order first, so a partial run covers every grid early."""
        seen: dict[str, Cell] = {}
        for grid in self.grids:
            for cell in expand_grid(self, grid):
                seen.setdefault(cell.cell_id, cell)
        return sorted(seen.values(), key=lambda c: c.config.seed)

    def grid(self, name: str) -> Grid:
        """The grid called ``name``."""
        for grid in self.grids:
            if grid.name == name:
                return grid
        raise KeyError(f"no grid {name!r} in preset {self.name!r}")

    def to_json(self) -> dict[str, Any]:
        """The raw TOML structure again (stored beside the results for the report)."""
        grids = [{"name": g.name, "kind": g.kind, "set": g.fixed, "axes": g.axes,
                  "rows": g.rows, "x": g.x, "description": g.description,
                  "reference": g.reference, "extra": [dict(e) for e in g.extra],
                  "overrides": [{"where": dict(o["where"]), "set": dict(o["set"])}
                                for o in g.overrides],
                  "paper": [{"where": p.where, "values": p.values} for p in g.paper]}
                 for g in self.grids]
        return {"preset": {"name": self.name, "description": self.description,
                           "num-supernodes": self.num_supernodes,
                           "cpus-per-client": self.cpus_per_client,
                           "cell-timeout": self.cell_timeout, "reductions": self.reductions,
                           "backend": self.backend,
                           **({"auto-selection": self.auto_selection}
                              if self.auto_selection else {})},
                "base": self.base, "variants": self.variants, "grid": grids}


def cell_id(run_config: dict[str, Any], num_supernodes: int) -> str:
    """12 hex digits of the SHA-256 of the cell's run config (paths dropped, ``auto`` selection
    and aggregation resolved, so equal runs share an id) and federation."""
    payload = {k: v for k, v in run_config.items() if k not in RUNNER_KEYS}
    choices = parse_run_config(payload).choices()
    payload["selection"], payload["aggregation"] = choices.selection, choices.aggregation
    text = json.dumps({"run-config": payload, "num-supernodes": num_supernodes},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def pin_auto_selection(run_config: dict[str, Any], auto_selection: str) -> dict[str, Any]:
    """``run_config`` with ``selection`` written as ``auto_selection`` where it is left to
    ``auto`` (absent or ``"auto"``) and the valuation computes phi (``auto`` means random
    selection for the others, as it always has). A preset whose cells ran when ``auto`` meant
    ``auto_selection`` keeps their ids, protocol hashes and behaviour after ``auto``'s meaning
    changes; empty ``auto_selection``: unchanged."""
    if not auto_selection or run_config.get("selection", "auto") != "auto":
        return run_config
    if str(run_config.get("valuation", RunConfig.valuation)) in NO_PHI:
        return run_config
    return {**run_config, "selection": auto_selection}


def point_config(point: dict[str, Any], variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A grid point's run-config keys: its ``variant`` (if any) expanded, then the rest."""
    cfg = {k: v for k, v in point.items() if k != VARIANT}
    if VARIANT in point:
        cfg = {**variants[point[VARIANT]], **cfg}
    return cfg


def expand_grid(preset: Preset, grid: Grid) -> list[Cell]:
    """The product of ``grid.axes`` over ``preset.base`` + ``grid.fixed``, in axis order, then
    each ``grid.extra`` product (``axes`` with its lists replaced) less the cells already in."""
    keys = list(grid.axes)

    def product(axes: dict[str, list[Any]]) -> list[Cell]:
        out = []
        for values in itertools.product(*(axes[k] for k in keys)):
            point = dict(zip(keys, values, strict=True))
            cfg = {**preset.base, **grid.fixed, **point_config(point, preset.variants)}
            for override in grid.overrides:
                if all(point.get(k) == v for k, v in override["where"].items()):
                    cfg.update(override["set"])
            cfg = pin_auto_selection(cfg, preset.auto_selection)
            out.append(Cell(cell_id(cfg, preset.num_supernodes), grid.name, cfg, point))
        return out

    cells = product(grid.axes)
    seen = {c.cell_id for c in cells}
    for extra in grid.extra:
        for cell in product({**grid.axes, **extra}):
            if cell.cell_id not in seen:
                cells.append(cell)
                seen.add(cell.cell_id)
    return cells
