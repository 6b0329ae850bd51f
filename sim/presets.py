"""Experiment presets: a TOML file -> validated grids (:mod:`sim.grid`: their cells).

A preset file has three kinds of tables (unknown keys anywhere are an error)::

    [preset]                  # name, description, simulation settings
    name = "paper-mnist-cpu"
    num-supernodes = 100      # virtual clients (the paper: 100)
    cpus-per-client = 1.0
    cell-timeout = 3600       # seconds per flwr run
    auto-selection = "adaptive"   # optional: what selection "auto" meant when these cells ran
    [base]                    # run-config keys shared by every cell (pyproject.toml names)
    num-server-rounds = 20
    backend = "flwr"          # flwr (a real flwr run per cell) | inline (sim.inline, no Ray)
    [variants]                # optional named bundles of run-config keys, an axis "variant"
    fedavg = { valuation = "none", selection = "random", aggregation = "examples" }
    [[grid]]                  # one table / sweep / ablation; cells = product of its axes
    name = "main"
    kind = "table"            # table | sweep | adversarial | ablation | tuning
    set = { imbalance-factor = 0.01 }           # fixed overrides for this grid
    axes = { valuation = ["owen", "none"], alpha = [0.01, 0.1], seed = [0, 1, 2] }
    rows = "valuation"        # table rows; columns are the other non-seed axes
    extra = [{ seed = [3, 4], alpha = [0.1], valuation = ["owen"] }]  # optional: more points
    overrides = [{ where = { alpha = 0.01, valuation = "owen" }, set = { budget-m = 8 } }]
    [[grid.paper]]            # the paper's numbers for the same cells (optional)
    where = { dataset = "mnist", imbalance-factor = 0.01, alpha = 0.01 }
    values = { owen = 84.77, none = 77.60 }

A cell is one run: ``base`` + ``set`` + one point of ``axes`` (a ``variant`` value expands to
its run-config keys). ``extra`` adds the products of ``axes`` with some value lists replaced,
e.g. two more seeds for the two rows of one column that lie too close to call: the tables keep
the grid's rows and columns (an extra value other than a seed must be one of its axis's) and
count each entry's seeds from its own cells. ``overrides`` sets run-config keys at some points
only (applied last, in order), e.g. a baseline tuned per setting: the arm keeps one row name
while its parameters differ by alpha, and the table keeps its rows and columns. A cell's id is
a hash of that run config (without paths, which differ between machines) and the simulation
settings, so the same cell has the same id in every preset, on every machine and under either
backend. The id resolves ``auto`` selection, so a change of what ``auto`` means would rename a
preset's cells; ``auto-selection`` (written into every preset whose cells ran before such a
change) pins the meaning they ran with into each cell that leaves selection to ``auto`` and
values clients (:func:`sim.grid.pin_auto_selection`), keeping their ids and protocol hashes.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from fedowen_strategy.selectors.registry import NEEDS_PHI_SELECTIONS
from server_app.config import parse_run_config
from sim.grid import (
    BACKENDS,
    KINDS,
    RUNNER_KEYS,
    VARIANT,
    Grid,
    PaperRef,
    Preset,
    point_config,
)

PRESET_KEYS = {"name", "description", "num-supernodes", "cpus-per-client", "cell-timeout",
               "reductions", "backend", "auto-selection"}
GRID_KEYS = {"name", "kind", "set", "axes", "rows", "x", "paper", "description", "reference",
             "extra", "overrides"}
OVERRIDE_KEYS = {"where", "set"}
PAPER_KEYS = {"where", "values"}
TOP_KEYS = {"preset", "base", "grid", "variants"}


class PresetError(ValueError):
    """A preset file that cannot be used; the message says what and where."""


def _unknown(where: str, got: dict[str, Any], allowed: set[str]) -> list[str]:
    return [f"{where}: unknown key {k!r} (allowed: {', '.join(sorted(allowed))})"
            for k in got if k not in allowed]


def _parse_grid(raw: dict[str, Any], i: int, base: dict[str, Any],
                variants: dict[str, dict[str, Any]]) -> tuple[Grid | None, list[str]]:
    where = f"[[grid]] #{i + 1} ({raw.get('name', '?')})"
    problems = _unknown(where, raw, GRID_KEYS)
    kind = raw.get("kind", "table")
    axes = raw.get("axes", {})
    if kind not in KINDS:
        problems.append(f"{where}: kind={kind!r} must be one of {KINDS}")
    if not isinstance(axes, dict) or not axes or not all(
            isinstance(v, list) and v for v in axes.values()):
        problems.append(f"{where}: axes must map run-config keys to non-empty lists")
        return None, problems
    rows = raw.get("rows", "valuation")
    x = raw.get("x", "")
    if rows not in axes and rows not in {**base, **raw.get("set", {})}:
        problems.append(f"{where}: rows={rows!r} is neither an axis nor a fixed key")
    if kind == "sweep" and x not in axes:
        problems.append(f"{where}: a sweep needs x = one of its axes {list(axes)}")
    reference = str(raw.get("reference", ""))
    if kind == "ablation" and reference not in axes.get(rows, []):
        problems.append(f"{where}: an ablation needs reference = one of its rows "
                        f"{axes.get(rows, [])} (the baseline of the paired differences)")
    if kind == "tuning" and not {**base, **raw.get("set", {})}.get("validation-fraction"):
        problems.append(f"{where}: a tuning grid picks by validation accuracy: set "
                        "validation-fraction > 0 in [base] or the grid's set")
    refs = []
    for j, ref in enumerate(raw.get("paper", [])):
        problems += _unknown(f"{where} paper #{j + 1}", ref, PAPER_KEYS)
        refs.append(PaperRef(dict(ref.get("where", {})),
                             {str(k): float(v) for k, v in ref.get("values", {}).items()}))
    unknown = [v for v in axes.get(VARIANT, []) if v not in variants]
    if unknown:
        problems.append(f"{where}: variants {unknown} are not defined in [variants] "
                        f"(defined: {sorted(variants)})")
        return None, problems
    problems += _axis_problems(where, axes, {**base, **raw.get("set", {})}, variants)
    extra = _parse_extra(raw.get("extra", []), where, axes, problems)
    overrides = _parse_overrides(raw.get("overrides", []), where, axes, base,
                                 raw.get("set", {}), variants, problems)
    fixed = dict(raw.get("set", {}))
    if rows not in axes and rows not in fixed and rows in base:
        fixed[rows] = base[rows]  # same config, but the grid now names its row value
    grid = Grid(str(raw.get("name", f"grid{i + 1}")), kind, fixed,
                {k: list(v) for k, v in axes.items()}, rows, x, tuple(refs),
                str(raw.get("description", "")), reference,
                tuple({k: list(v) for k, v in e.items()} for e in extra), tuple(overrides))
    return grid, problems


def _axis_problems(where: str, axes: dict[str, list[Any]], fixed: dict[str, Any],
                   variants: dict[str, dict[str, Any]]) -> list[str]:
    """One config per axis value checked by the app's own parser (types, ranges, keys): the
    first problem of each axis."""
    problems = []
    first = {k: v[0] for k, v in axes.items()}
    for key, values in axes.items():
        for value in values:
            try:
                parse_run_config({**fixed, **point_config({**first, key: value}, variants)})
            except ValueError as err:
                problems.append(f"{where}: {key}={value!r}: {err}")
                break
    return problems


def _parse_extra(extra: Any, where: str, axes: dict[str, list[Any]],
                 problems: list[str]) -> list[dict[str, Any]]:
    """A grid's ``extra`` points (tables of axis value lists), their problems appended."""
    if not isinstance(extra, list) or not all(isinstance(e, dict) and e for e in extra):
        problems.append(f"{where}: extra must be a list of tables of axis value lists, e.g. "
                        "extra = [{ seed = [3, 4], variant = [\"fedowen\"] }]")
        return []
    for j, entry in enumerate(extra):
        for key, values in entry.items():
            if key not in axes:
                problems.append(f"{where} extra #{j + 1}: {key!r} is not one of the axes "
                                f"{list(axes)}; extra points only change axis values")
            elif not isinstance(values, list) or not values:
                problems.append(f"{where} extra #{j + 1}: {key} must be a non-empty list")
            elif key != "seed" and any(v not in axes[key] for v in values):
                problems.append(f"{where} extra #{j + 1}: {key}={values} must be among the "
                                f"axis's values {axes[key]} (only seeds may be new)")
    return extra


def _parse_overrides(raw: Any, where: str, axes: dict[str, list[Any]], base: dict[str, Any],
                     fixed: dict[str, Any], variants: dict[str, dict[str, Any]],
                     problems: list[str]) -> list[dict[str, dict[str, Any]]]:
    """A grid's ``overrides``: each ``where`` names axis values, each ``set`` run-config keys
    the app accepts at every point it matches; problems are appended."""
    if not isinstance(raw, list) or not all(isinstance(o, dict) for o in raw):
        problems.append(f"{where}: overrides must be a list of tables, e.g. overrides = "
                        "[{ where = { alpha = 0.01, variant = \"fedavgm\" }, set = { "
                        "server-momentum = 0.9 } }]")
        return []
    out = []
    for j, entry in enumerate(raw):
        at = f"{where} overrides #{j + 1}"
        problems.extend(_unknown(at, entry, OVERRIDE_KEYS))
        match, keys = entry.get("where"), entry.get("set")
        if not isinstance(match, dict) or not match or not isinstance(keys, dict) or not keys:
            problems.append(f"{at}: needs where = {{ axis = value, ... }} and set = {{ run-config "
                            "keys }}, both non-empty")
            continue
        bad = [f"{k}={v!r}" for k, v in match.items() if k not in axes or v not in axes[k]]
        if bad:
            problems.append(f"{at}: where {', '.join(bad)} is not an axis value of this grid "
                            f"(axes: {axes}); an override only changes points the grid has")
            continue
        first = {k: match.get(k, v[0]) for k, v in axes.items()}
        try:
            parse_run_config({**base, **fixed, **point_config(first, variants), **keys})
        except ValueError as err:
            problems.append(f"{at}: {err}")
            continue
        out.append({"where": dict(match), "set": dict(keys)})
    return out


def parse_preset(raw: dict[str, Any]) -> Preset:
    """Validate a preset's TOML structure; every problem is reported at once.

    Raises
    ------
    PresetError
        Unknown keys, run-config keys the app does not know, bad values or kinds.
    """
    problems = _unknown("top level", raw, TOP_KEYS)
    meta = raw.get("preset", {})
    problems += _unknown("[preset]", meta, PRESET_KEYS)
    base = dict(raw.get("base", {}))
    for key in RUNNER_KEYS:
        if key in base:
            problems.append(f"[base]: {key!r} is set by the runner per cell; remove it")
    try:
        parse_run_config(base)
    except ValueError as err:
        problems.append(f"[base]: {err}")
    variants = {str(k): dict(v) for k, v in raw.get("variants", {}).items()
                if isinstance(v, dict)}
    if len(variants) != len(raw.get("variants", {})):
        problems.append("[variants]: every entry must be a table of run-config keys")
    backend = meta.get("backend", "flwr")
    if backend not in BACKENDS:
        problems.append(f"[preset]: backend={backend!r} must be one of {BACKENDS}")
    auto_selection = str(meta.get("auto-selection", ""))
    if auto_selection and auto_selection not in NEEDS_PHI_SELECTIONS:
        problems.append(f"[preset]: auto-selection={auto_selection!r} must be one of "
                        f"{NEEDS_PHI_SELECTIONS} (what auto meant for clients valued by phi)")
    grids = []
    for i, graw in enumerate(raw.get("grid", [])):
        grid, errs = _parse_grid(graw, i, base, variants)
        problems += errs
        if grid is not None:
            grids.append(grid)
    if not grids:
        problems.append("no [[grid]] tables: a preset needs at least one")
    if "name" not in meta:
        problems.append("[preset]: name is required")
    if problems:
        raise PresetError("invalid preset: " + "; ".join(problems))
    return Preset(str(meta["name"]), str(meta.get("description", "")),
                  int(meta.get("num-supernodes", 100)), float(meta.get("cpus-per-client", 1.0)),
                  float(meta.get("cell-timeout", 3600)), base, tuple(grids),
                  str(meta.get("reductions", "")), str(backend), variants, auto_selection)


def load_preset(path: str | Path) -> Preset:
    """Read and validate a preset TOML file (see the module docstring for the schema)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise PresetError(f"cannot read preset {path}: {err}") from err
    try:
        return parse_preset(raw)
    except PresetError as err:
        raise PresetError(f"{path}: {err}") from err
