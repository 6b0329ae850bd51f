"""A report's sections beyond its table and sweep grids: one table, declared outside the harness.

:mod:`sim.report` writes the header and the ``table`` and ``sweep`` grids itself; every other
section is a study's, and ``pyproject.toml`` names it under ``[tool.fedowen.report]`` by its
``module:function``, in page order::

    [tool.fedowen.report]
    before-grids = ["<module>:<function>"]   # (preset, res, out) -> Part, before the grids
    after-grids = ["<module>:<function>"]    # (preset, res, out) -> Part, after them
    [tool.fedowen.report.grids]              # a grid kind's section, once per grid of the kind
    <kind> = "<module>:<function>"           # (grid, preset, res, out) -> Part
    <kind> = ""                              # no per-grid section: one after the grids writes
                                             # all of that kind's grids together

The harness imports what the table names when a report is written (as Flower imports the apps
``[tool.flwr.app.components]`` names), so no harness module imports or names a study
(``tests/test_architecture.py`` checks it). A section that has nothing to say for a preset
returns an empty :class:`Part`.
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.grid import KINDS, Grid, Preset
from sim.results import CellResult

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
TABLE = "tool.fedowen.report"
TABLE_KEYS = {"before-grids", "grids", "after-grids"}
#: The grid kinds :mod:`sim.report` writes itself.
BUILT_IN = ("table", "sweep")


@dataclass(frozen=True)
class Part:
    """What one section adds to a report: README lines, ``final_accuracy.csv`` rows, files."""

    lines: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


PresetSection = Callable[[Preset, dict[str, CellResult], Path], Part]
GridSection = Callable[[Grid, Preset, dict[str, CellResult], Path], Part]


@dataclass(frozen=True)
class Sections:
    """The resolved table: preset-wide sections before and after the grids, and per grid kind
    its section (None: its grids are written by a section after the grids)."""

    before: tuple[PresetSection, ...] = ()
    grids: Mapping[str, GridSection | None] = field(default_factory=dict)
    after: tuple[PresetSection, ...] = ()


def declared(path: Path = PYPROJECT) -> dict[str, Any]:
    """``[tool.fedowen.report]`` of ``path`` (empty when the file has none)."""
    raw: Any = tomllib.loads(path.read_text())
    for key in TABLE.split("."):
        raw = raw.get(key, {})
    return dict(raw)


def resolve(name: str, where: str) -> Callable[..., Part]:
    """The function ``module:function`` names; ``where`` says which entry, for the error."""
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"[{TABLE}] {where} = {name!r}: give module:function, e.g. "
                         "'package.module:section'")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"[{TABLE}] {where} = {name!r} does not resolve: {err}") from err
    if not callable(found):
        raise ValueError(f"[{TABLE}] {where} = {name!r} is not a function")
    return found


def load_sections(table: Mapping[str, Any] | None = None) -> Sections:
    """The section table (default: ``pyproject.toml``'s) with every name imported.

    Raises
    ------
    ValueError
        An unknown key, a grid kind the presets do not have (:data:`sim.grid.KINDS`) or one the
        harness writes itself, or a name that does not resolve: each named.
    """
    table = declared() if table is None else table
    problems = [f"[{TABLE}]: unknown key {k!r} (allowed: {', '.join(sorted(TABLE_KEYS))})"
                for k in table if k not in TABLE_KEYS]
    grids = dict(table.get("grids", {}))
    problems += [f"[{TABLE}.grids]: {kind!r} is not a grid kind a section can take (one of "
                 f"{[k for k in KINDS if k not in BUILT_IN]})"
                 for kind in grids if kind not in KINDS or kind in BUILT_IN]
    if problems:
        raise ValueError("; ".join(problems))

    def preset_wide(key: str) -> tuple[PresetSection, ...]:
        return tuple(resolve(name, f"{key}[{i}]") for i, name in enumerate(table.get(key, [])))

    return Sections(
        preset_wide("before-grids"),
        {kind: resolve(name, f"grids.{kind}") if name else None for kind, name in grids.items()},
        preset_wide("after-grids"))
