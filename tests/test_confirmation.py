"""The confirmation's tuning (sim.confirmation): picked by validation accuracy, never test."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from sim.grid import PresetError, parse_preset
from sim.report import write_report

CANDIDATES = {"a": {"lr": 0.02}, "b": {"lr": 0.05}, "c": {"lr": 0.01}}


def tuning_preset(**base: Any) -> dict[str, Any]:
    return {"preset": {"name": "tune", "num-supernodes": 10, "backend": "inline"},
            "base": {"dataset": "mnist", "num-server-rounds": 6, "validation-fraction": 0.05,
                     "valuation": "none", "selection": "random", "aggregation": "uniform",
                     **base},
            "variants": CANDIDATES,
            "grid": [{"name": "tune-recipe", "kind": "tuning", "rows": "variant",
                      "axes": {"seed": [50, 51], "variant": list(CANDIDATES)}}]}


def write_cell(out: Path, val: float, test: float) -> None:
    out.mkdir(parents=True)
    with (out / "rounds.jsonl").open("w") as fh:
        for rnd in range(7):  # rounds 2-6 are the last five
            fh.write(json.dumps({"round": rnd, "test_accuracy": test,
                                 "val_accuracy": val if rnd >= 2 else 0.0}) + "\n")


def test_the_pick_follows_validation_accuracy_and_ignores_test(tmp_path: Path) -> None:
    # Prepare: b is best on validation, c on test (by far); a ties b on seed 50 only
    preset = parse_preset(tuning_preset())
    scores = {("a", 50): (0.90, 0.5), ("a", 51): (0.80, 0.5), ("b", 50): (0.90, 0.5),
              ("b", 51): (0.86, 0.5), ("c", 50): (0.70, 0.99), ("c", 51): (0.70, 0.99)}
    for cell in preset.cells():
        key = (cell.point["variant"], cell.run_config["seed"])
        write_cell(tmp_path / "res" / cell.cell_id, *scores[key])
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "Pick: **b**" in readme
    assert "| b | lr = 0.05 | 90.00 | 86.00 | 88.00 ± " in readme
    with (tmp_path / "out" / "tune-recipe-validation.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["variant"], r["seed"], r["picked"]) for r in rows if r["picked"] == "True"] == [
        ("b", "50", "True"), ("b", "51", "True")]
    assert float(next(r for r in rows if r["variant"] == "c")["val_last5"]) == pytest.approx(70)
    # the per-round data beside the plot: 3 candidates x 2 seeds x 7 rounds, validation only
    with (tmp_path / "out" / "tune-recipe-rounds.csv").open() as fh:
        per_round = list(csv.DictReader(fh))
    assert len(per_round) == 42 and "test_accuracy" not in per_round[0]
    assert (tmp_path / "out" / "tune-recipe-validation.png").stat().st_size > 0
    assert "99.00" not in readme  # test accuracy is never shown


def test_a_tie_goes_to_the_first_listed_and_a_missing_seed_picks_nothing(
        tmp_path: Path) -> None:
    preset = parse_preset(tuning_preset())
    cells = preset.cells()
    for cell in cells:
        if (cell.point["variant"], cell.run_config["seed"]) != ("c", 51):
            write_cell(tmp_path / "res" / cell.cell_id, 0.8, 0.8)
    write_report(preset, tmp_path / "res", tmp_path / "out")
    assert "Pick: none yet" in (tmp_path / "out" / "README.md").read_text()
    missing = next(c for c in cells if (c.point["variant"], c.run_config["seed"]) == ("c", 51))
    write_cell(tmp_path / "res" / missing.cell_id, 0.8, 0.8)
    write_report(preset, tmp_path / "res", tmp_path / "out")
    assert "Pick: **a**" in (tmp_path / "out" / "README.md").read_text()


def test_a_tuning_grid_without_a_validation_set_is_refused() -> None:
    with pytest.raises(PresetError, match="validation-fraction"):
        parse_preset(tuning_preset(**{"validation-fraction": 0.0}))


def _seeds_in(value: Any) -> set[int]:
    """Every ``seed`` value anywhere in a parsed TOML document."""
    if isinstance(value, dict):
        found = set()
        for key, item in value.items():
            if key == "seed":
                found |= set(item) if isinstance(item, list) else {item}
            else:
                found |= _seeds_in(item)
        return found
    if isinstance(value, list):
        return set().union(*(_seeds_in(v) for v in value)) if value else set()
    return set()


def test_no_earlier_result_or_preset_used_the_tuning_or_confirmation_seeds() -> None:
    # The confirmation's seeds must be fresh: every committed cell archive (each cell's
    # config.json) and every preset outside the confirmation's own says which seeds it ran
    import tarfile
    import tomllib

    from sim.confirmation import CONFIRMATION_SEEDS, PRESET_PREFIX, TUNING_SEEDS

    root = Path(__file__).resolve().parents[1]
    used: set[int] = set()
    archives = [a for a in (root / "docs" / "results").glob("*/cells.tar.gz")
                if not a.parent.name.startswith(PRESET_PREFIX)]
    for archive in archives:
        with tarfile.open(archive) as tar:
            for member in tar:
                if member.name.endswith("/config.json"):
                    handle = tar.extractfile(member)
                    assert handle is not None
                    used.add(int(json.load(handle)["seed"]))
    presets = list((root / "conf").glob("*.toml"))
    for preset in presets:
        used |= _seeds_in(tomllib.loads(preset.read_text()))
    assert len(archives) >= 5 and len(presets) >= 10 and {0, 1, 2} <= used  # it looked
    assert not used & set(CONFIRMATION_SEEDS), sorted(used & set(CONFIRMATION_SEEDS))
    assert not used & set(TUNING_SEEDS), sorted(used & set(TUNING_SEEDS))
    # and the confirmation's presets tune on the tuning seeds only
    for preset in (root / "conf" / "confirm").glob("*.toml"):
        doc = tomllib.loads(preset.read_text())
        for grid in doc["grid"]:
            if grid.get("kind") == "tuning":
                assert set(grid["axes"]["seed"]) == set(TUNING_SEEDS), preset.name
