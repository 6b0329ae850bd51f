"""Ablation grids beyond one table: the overview of split values, extra seeds and points,
overrides, and the committed arena preset."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from sim.presets import PresetError, parse_preset
from sim.report import write_report
from tests.fake_runner import VARIANTS, ablation_preset, write_rounds


def test_overview_puts_every_grid_of_a_split_value_in_one_table(tmp_path: Path) -> None:
    # Prepare: a clean grid and an attacked one (two kinds), both over alpha; fedowen wins
    # only under noise, by 5 points; every round takes fedowen twice the reference's time
    raw = ablation_preset(axes={"seed": [0, 1], "alpha": [0.1, 0.01],
                                "variant": list(VARIANTS)})
    raw["grid"].append({**raw["grid"][0], "name": "attacked",
                        "set": {"adversary-fraction": 0.2},
                        "axes": {"seed": [0, 1], "adversary-kind": ["noise", "free-rider"],
                                 "alpha": [0.1, 0.01], "variant": list(VARIANTS)},
                        # a third seed for one entry: its count is named
                        "extra": [{"seed": [2], "adversary-kind": ["noise"], "alpha": [0.1],
                                   "variant": ["fedowen"]}]})
    preset = parse_preset(raw)
    for cell in preset.cells():
        cfg, ours = cell.run_config, cell.point["variant"] == "fedowen"
        acc = 0.80 + (0.05 if ours and cfg.get("adversary-kind") == "noise" else
                      -0.01 if ours else 0.0) + 0.01 * cfg["seed"]
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, acc],
                     {"weights": {"a": 1.0}, "returned": ["a"],
                      "round_seconds": 2.0 if ours else 1.0})
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert: one table per alpha, the clean grid and both attacks as columns, best in bold
    md = (tmp_path / "out" / "README.md").read_text()
    overview = md.split("## Overview")[1].split("## abl")[0]
    assert overview.count("| variant | abl | attacked, noise | attacked, free-rider |") == 2
    assert "alpha = 0.1:" in overview and "alpha = 0.01:" in overview
    assert overview.count("| fedowen | 79.50 ± 6.35 | **85.50 ± 6.35** | 79.50 ± 6.35 |") == 1
    assert "| fedowen | 79.50 ± 6.35 | **86.00 ± 2.48 (n=3)** | 79.50 ± 6.35 |" in overview
    assert overview.count("| fedavg-equal | **80.50 ± 6.35** | 80.50 ± 6.35 | "
                          "**80.50 ± 6.35** |") == 2
    assert "fedowen 2.00x" in overview


def test_extra_seeds_for_a_close_call_join_the_same_table(tmp_path: Path) -> None:
    # Prepare: a close call (1.5 points) given two more seeds for both rows, as extra points
    raw = ablation_preset(extra=[{"seed": [3, 4]}])
    preset = parse_preset(raw)
    finals = {"fedavg-equal": [0.80, 0.70, 0.60, 0.70, 0.70],
              "fedowen": [0.83, 0.70, 0.615, 0.72, 0.73]}
    for cell in preset.cells():
        write_rounds(tmp_path / "res" / cell.cell_id,
                     [0.1, 0.5, 0.6, finals[cell.point["variant"]][cell.run_config["seed"]]],
                     {"weights": {"a": 1.0}, "returned": ["a"]})
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert: 10 cells, the 5-seed paired difference (mean 1.9) and no call for more seeds
    assert len(preset.cells()) == 10
    assert [c.run_config["seed"] for c in preset.cells()][-4:] == [3, 3, 4, 4]
    md = (tmp_path / "out" / "README.md").read_text()
    assert ("- alpha=0.1: `fedowen` (5 seeds) best; `fedavg-equal` 1.90 points below (5 seeds)"
            in md) and "more seeds wanted" not in md
    rows = list(csv.DictReader((tmp_path / "out" / "abl-summary.csv").open()))
    owen = next(r for r in rows if r["variant"] == "fedowen" and r["metric"] == "final")
    assert owen["n"] == "5" and owen["paired_n"] == "5"


def test_extra_points_on_one_row_are_counted_per_row(tmp_path: Path) -> None:
    # Prepare: only fedowen gets seeds 3 and 4, so the reference row stays at 3 of 3
    preset = parse_preset(ablation_preset(extra=[{"seed": [3, 4], "variant": ["fedowen"]}]))
    for cell in preset.cells():
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, 0.7],
                     {"weights": {"a": 1.0}, "returned": ["a"]})
    (tmp_path / "res" / preset.cells()[-1].cell_id / "rounds.jsonl").unlink()
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert: fedowen's entry says 4 of its 5 planned seeds; fedavg-equal's no count at all
    md = (tmp_path / "out" / "README.md").read_text()
    table = md[md.index("| variant |"):].splitlines()
    assert "(n=4/5)" in next(r for r in table if r.startswith("| fedowen |"))
    assert "(n=" not in next(r for r in table if r.startswith("| fedavg-equal |"))


@pytest.mark.parametrize(("extra", "match"), [
    ([{"lr": [0.1]}], "not one of the axes"),
    ([{"alpha": [0.5]}], "only seeds may be new"),
    ([{"seed": []}], "non-empty list"),
    ({"seed": [3]}, "list of tables"),
])
def test_extra_points_are_validated(extra: Any, match: str) -> None:
    with pytest.raises(PresetError, match=match):
        parse_preset(ablation_preset(extra=extra))


def test_an_override_changes_only_the_points_it_names_and_survives_the_stored_preset() -> None:
    # Prepare: fedowen tuned per alpha: budget 8 at alpha 0.01 only
    raw = ablation_preset(overrides=[{"where": {"alpha": 0.01, "variant": "fedowen"},
                                      "set": {"budget-m": 8}}])
    raw["grid"][0]["axes"]["alpha"] = [0.1, 0.01]
    plain = ablation_preset()
    plain["grid"][0]["axes"]["alpha"] = [0.1, 0.01]
    # Execute
    preset = parse_preset(raw)
    cells = {(c.point["variant"], c.point["alpha"], c.run_config["seed"]): c
             for c in preset.cells()}
    # Assert: the one arm x setting has the key, every other cell is the plain preset's cell
    assert {k for k, c in cells.items() if c.run_config.get("budget-m") == 8} == {
        ("fedowen", 0.01, s) for s in (0, 1, 2)}
    others = {c.cell_id for k, c in cells.items() if k[:2] != ("fedowen", 0.01)}
    assert others <= {c.cell_id for c in parse_preset(plain).cells()}
    assert len(cells) == 12 and preset.grids[0].column_keys == ["alpha"]
    # the results folder's preset.json reads back to the same cells
    again = parse_preset(json.loads(json.dumps(preset.to_json())))
    assert [c.cell_id for c in again.cells()] == [c.cell_id for c in preset.cells()]


@pytest.mark.parametrize(("overrides", "match"), [
    ([{"where": {"alpha": 0.5}, "set": {"budget-m": 8}}], "not an axis value"),
    ([{"where": {"lr": 0.1}, "set": {"budget-m": 8}}], "not an axis value"),
    ([{"where": {"alpha": 0.1}, "set": {}}], "both non-empty"),
    ([{"where": {"alpha": 0.1}, "set": {"budget-m": 8}, "to": 1}], "unknown key 'to'"),
    ([{"where": {"alpha": 0.1}, "set": {"no-such-key": 1}}], "no-such-key"),
    ({"where": {"alpha": 0.1}}, "list of tables"),
])
def test_overrides_are_validated(overrides: Any, match: str) -> None:
    with pytest.raises(PresetError, match=match):
        parse_preset(ablation_preset(overrides=overrides))


def test_committed_arena_preset_follows_the_protocol() -> None:
    # issue 17: 7 defences x 7 attacks x both alphas, 100 rounds, >= 3 seeds per cell, paired
    # against FLTrust; a close call's extra seeds add cells to the same grids
    from sim.presets import load_preset

    preset = load_preset(Path(__file__).resolve().parents[1] / "conf" / "arena-mnist.toml")
    assert preset.base["num-server-rounds"] == 100
    ablations = [g for g in preset.grids if g.kind == "ablation"]
    assert {g.reference for g in ablations} == {"fltrust"}
    points = {(c.point["variant"], c.run_config.get("adversary-kind", "none"),
               c.run_config["alpha"]) for c in preset.cells()}
    assert len(points) == 7 * 7 * 2
    for point in points:
        seeds = {c.run_config["seed"] for c in preset.cells()
                 if (c.point["variant"], c.run_config.get("adversary-kind", "none"),
                     c.run_config["alpha"]) == point}
        assert seeds in ({0, 1, 2}, {0, 1, 2, 3, 4}), point
