"""The report's section table (sim/sections.py): the harness writes table and sweep grids, every
other section comes from the table pyproject.toml declares, by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.grid import KINDS, Grid, Preset
from sim.presets import parse_preset
from sim.report import write_report
from sim.results import CellResult
from sim.sections import BUILT_IN, Part, declared, load_sections
from tests.fake_runner import small_preset, write_rounds

CALLS: list[str] = []


def before(preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    CALLS.append("before")
    return Part(["## Before", ""])


def after(preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    CALLS.append("after")
    (out / "after.txt").write_text("x")
    return Part(["## After", ""], [{"grid": "after", "metric": "m"}], [out / "after.txt"])


def per_grid(grid: Grid, preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    CALLS.append(f"grid {grid.name}")
    return Part([f"## Ablation {grid.name}", ""])


def finished_preset(tmp_path: Path, grids: list[dict[str, Any]]) -> Preset:
    raw = small_preset()
    raw["grid"] = grids
    preset = parse_preset(raw)
    for cell in preset.cells():
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, 0.8])
    return preset


def test_sections_run_in_page_order_around_the_harness_grids(tmp_path: Path) -> None:
    # Prepare: a table grid between two ablation grids; this module's functions as the table
    me = __name__
    sections = load_sections({"before-grids": [f"{me}:before"], "after-grids": [f"{me}:after"],
                              "grids": {"ablation": f"{me}:per_grid"}})
    axes = {"seed": [0], "variant": ["a", "b"]}
    variants = {"a": {"valuation": "owen"}, "b": {"valuation": "none"}}
    raw_grids = [{"name": "g1", "kind": "ablation", "axes": axes, "rows": "variant",
                  "reference": "a"},
                 {"name": "t", "axes": {"seed": [0], "valuation": ["owen", "none"]}},
                 {"name": "g2", "kind": "ablation", "axes": axes, "rows": "variant",
                  "reference": "a"}]
    raw = small_preset()
    raw.update(grid=raw_grids, variants=variants)
    preset = parse_preset(raw)
    for cell in preset.cells():
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, 0.8])
    CALLS.clear()
    # Execute
    files = write_report(preset, tmp_path / "res", tmp_path / "out", sections=sections)
    # Assert: before, the grids in the preset's order, after; the after section's row and file
    md = (tmp_path / "out" / "README.md").read_text()
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    assert heads == ["## Before", "## Ablation g1", "## t", "## Ablation g2", "## After"]
    assert CALLS == ["before", "grid g1", "grid g2", "after"]
    assert files[-1] == tmp_path / "out" / "after.txt"
    assert (tmp_path / "out" / "final_accuracy.csv").read_text().splitlines()[-1].startswith(
        "after,m,")


def test_an_empty_table_reports_table_grids_and_refuses_a_kind_without_a_section(
        tmp_path: Path) -> None:
    # Prepare
    table = finished_preset(tmp_path, [{"name": "t", "axes": {"seed": [0], "valuation": ["owen"]}}])
    ablation = parse_preset({**small_preset(), "grid": [
        {"name": "a", "kind": "ablation", "axes": {"seed": [0], "valuation": ["owen", "none"]},
         "reference": "owen"}]})
    # Execute / Assert
    write_report(table, tmp_path / "res", tmp_path / "out", sections=load_sections({}))
    assert "## t" in (tmp_path / "out" / "README.md").read_text()
    with pytest.raises(ValueError, match=r"no report section for grid kind\(s\) \['ablation'\]"):
        write_report(ablation, tmp_path / "res", tmp_path / "out2", sections=load_sections({}))


@pytest.mark.parametrize(("table", "message"), [
    ({"sections": []}, "unknown key 'sections'"),
    ({"grids": {"table": "x:y"}}, "'table' is not a grid kind a section can take"),
    ({"grids": {"ablation": "no_such_module_here:f"}}, "grids.ablation = .* does not resolve"),
    ({"after-grids": ["sim.report"]}, r"after-grids\[0\] = 'sim.report': give module:function"),
    ({"before-grids": ["sim.report:CSV_FIELDS"]}, "is not a function"),
])
def test_a_bad_table_names_its_entry(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_sections(table)


def test_the_declared_table_resolves_and_covers_every_kind_the_harness_does_not_write() -> None:
    # every grid kind of the presets has a writer: the harness's own or the table's
    sections = load_sections(declared())
    assert set(sections.grids) == set(KINDS) - set(BUILT_IN)
    assert sections.before and sections.after
