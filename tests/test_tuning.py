"""The confirmation's tuning (studies.confirmation.tuning, studies.confirmation.pages): picked
by validation accuracy, never test; its table on the confirmation page per setting."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from sim.compact import open_csv
from sim.presets import PresetError, parse_preset
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
    with open_csv(tmp_path / "out" / "tune-recipe-rounds.csv.gz") as fh:
        per_round = list(csv.DictReader(fh))
    assert len(per_round) == 42 and "test_accuracy" not in per_round[0]
    assert (tmp_path / "out" / "tune-recipe-validation.png").stat().st_size > 0
    assert "99.00" not in readme  # test accuracy is never shown


def test_a_tie_goes_to_the_first_listed_and_a_missing_seed_picks_nothing(
        tmp_path: Path) -> None:
    preset = parse_preset(tuning_preset())
    cells = preset.cells()
    # every candidate on seed 50 alone is not a pick either: seed 51 is still to come
    for cell in cells:
        if cell.run_config["seed"] == 50:
            write_cell(tmp_path / "res" / cell.cell_id, 0.8, 0.8)
    write_report(preset, tmp_path / "res", tmp_path / "out")
    assert "Pick: none yet" in (tmp_path / "out" / "README.md").read_text()
    for cell in cells:
        if cell.run_config["seed"] == 51 and cell.point["variant"] != "c":
            write_cell(tmp_path / "res" / cell.cell_id, 0.8, 0.8)
    write_report(preset, tmp_path / "res", tmp_path / "out")
    assert "Pick: none yet" in (tmp_path / "out" / "README.md").read_text()
    missing = next(c for c in cells if (c.point["variant"], c.run_config["seed"]) == ("c", 51))
    write_cell(tmp_path / "res" / missing.cell_id, 0.8, 0.8)
    write_report(preset, tmp_path / "res", tmp_path / "out")
    assert "Pick: **a**" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("families", [("tune-fedavgm", "tune-fedprox"), ("tune-poc", "tune-oort")])
def test_the_better_of_two_families_is_the_family_pick_of_the_higher_score(
        tmp_path: Path, families: tuple[str, str]) -> None:
    # Prepare: two families at two alphas; FedAvgM's pick scores higher at 0.1, FedProx's at
    # 0.01 (where FedAvgM's pick is best on test accuracy, which is never read)
    raw = tuning_preset()
    raw["preset"]["name"] = "confirm2-tune"  # the first confirmation ran both families
    raw["variants"] = {"m1": {"lr": 0.02}, "m2": {"lr": 0.05}, "p1": {"lr": 0.01},
                       "p2": {"lr": 0.03}}
    raw["grid"] = [{"name": name, "kind": "tuning", "rows": "variant",
                    "axes": {"seed": [50, 51], "alpha": [0.1, 0.01], "variant": rows}}
                   for name, rows in zip(families, (["m1", "m2"], ["p1", "p2"]), strict=True)]
    preset = parse_preset(raw)
    val = {("m1", 0.1): 0.9, ("m2", 0.1): 0.8, ("p1", 0.1): 0.85, ("p2", 0.1): 0.7,
           ("m1", 0.01): 0.6, ("m2", 0.01): 0.5, ("p1", 0.01): 0.4, ("p2", 0.01): 0.7}
    cells = preset.cells()
    for cell in cells:
        key = (cell.point["variant"], cell.point["alpha"])
        if key != ("p2", 0.01) or cell.run_config["seed"] == 50:
            write_cell(tmp_path / "res" / cell.cell_id, val[key], 0.99 if key[0] == "m1" else 0.5)
    # Execute: one FedProx cell at alpha 0.01 is still to run
    write_report(preset, tmp_path / "res", tmp_path / "out")
    readme = (tmp_path / "out" / "README.md").read_text()
    # Assert: alpha 0.1 decided, alpha 0.01 not yet
    assert f"## The better of {families[0]} and {families[1]}" in readme
    assert "| alpha=0.1 | m1 (90.00) | p1 (85.00) | **m1** |" in readme
    assert "| alpha=0.01 | m1 (60.00) | not yet | not yet |" in readme
    # Execute: the last cell
    last = next(c for c in cells if (c.point["variant"], c.point["alpha"],
                                     c.run_config["seed"]) == ("p2", 0.01, 51))
    write_cell(tmp_path / "res" / last.cell_id, 0.7, 0.5)
    write_report(preset, tmp_path / "res", tmp_path / "out")
    assert "| alpha=0.01 | m1 (60.00) | p2 (70.00) | **p2** |" in (
        tmp_path / "out" / "README.md").read_text()
    raw["preset"]["name"] = "confirm-tune"
    write_report(parse_preset(raw), tmp_path / "res", tmp_path / "first")
    assert "The better of" not in (tmp_path / "first" / "README.md").read_text()


def test_a_tuning_grid_without_a_validation_set_is_refused() -> None:
    with pytest.raises(PresetError, match="validation-fraction"):
        parse_preset(tuning_preset(**{"validation-fraction": 0.0}))


def test_the_second_confirmations_tuning_is_what_its_protocol_says() -> None:
    # docs/confirmation2/PROTOCOL.md section 4: per setting FedAvgM, FedProx and FLTrust, three
    # candidates each on seeds 50-51 and the validation split; the selectors tuned per family
    # exactly where the selection development grid did not cover the setting
    from server_app.evaluation import evaluated
    from sim.presets import load_preset
    from studies.confirmation.hypotheses import ENDPOINT_ROUNDS
    from studies.confirmation.protocol import SECOND_PRESET_PREFIX, TUNING_SEEDS
    from studies.confirmation.tuning import BETTER_OF

    root = Path(__file__).resolve().parents[1]
    dev = load_preset(root / "conf" / "selection-dev.toml")
    covered = {(c.config.dataset, None if c.config.dataset == "femnist" else c.config.alpha)
               for c in dev.cells()}
    presets = [load_preset(p) for p in sorted((root / "conf" / "confirm2").glob("*.toml"))]
    assert len(presets) == 5
    settings = 0
    for preset in presets:
        assert preset.name.startswith(SECOND_PRESET_PREFIX)
        grids = {g.name: g for g in preset.grids if g.kind == "tuning"}
        for name in ("tune-fedavgm", "tune-fedprox", "tune-fltrust"):
            assert len(grids[name].axes["variant"]) == 3, (preset.name, name)
        for grid in grids.values():
            assert tuple(grid.axes["seed"]) == TUNING_SEEDS, (preset.name, grid.name)
        tuned_selectors = {(c.config.dataset,
                            None if c.config.dataset == "femnist" else c.config.alpha)
                           for name in BETTER_OF[1] if name in grids
                           for c in preset.cells() if c.grid == name}
        for cell in (c for c in preset.cells() if c.grid == "tune-fedavgm"):
            setting = (cell.config.dataset,
                       None if cell.config.dataset == "femnist" else cell.config.alpha)
            assert (setting in tuned_selectors) != (setting in covered), (preset.name, setting)
        settings += len({c.config.alpha for c in preset.cells() if c.grid == "tune-fedavgm"})
        # every cell measures the rounds its endpoint reads (validation for the picks, test
        # for the confirmation), whatever its eval-every
        for cell in preset.cells():
            cfg = cell.config
            assert all(evaluated(r, cfg.num_server_rounds, cfg.eval_every)
                       for r in ENDPOINT_ROUNDS), (preset.name, cell.cell_id)
    assert settings == 8  # the first confirmation's eight settings


def test_the_confirmation_arms_carry_the_committed_tuning_picks() -> None:
    # Every confirm grid's recipe (the preset's [base] lr and momentum), fedavgm and fedprox arms
    # are the candidates its committed tuning report picked, value for value
    import tomllib

    root = Path(__file__).resolve().parents[1]
    checked = 0
    for path in sorted((root / "conf" / "confirm").glob("*.toml")):
        doc = tomllib.loads(path.read_text())
        if not any(g["name"] == "confirm" for g in doc["grid"]):
            continue
        report = root / "docs" / "results" / doc["preset"]["name"]
        for grid, arm in (("tune-recipe", None), ("tune-fedavgm", "fedavgm"),
                          ("tune-fedprox", "fedprox")):
            with (report / f"{grid}-validation.csv").open() as fh:
                picked = {r["variant"] for r in csv.DictReader(fh) if r["picked"] == "True"}
            assert len(picked) == 1, (path.name, grid, picked)
            chosen = doc["variants"][picked.pop()]
            if arm is None:
                assert (doc["base"]["lr"], doc["base"]["momentum"]) == (
                    chosen["lr"], chosen["momentum"]), path.name
            else:
                assert doc["variants"][arm] == chosen, (path.name, arm)
        checked += 1
    assert checked >= 4


def test_the_tuning_table_picks_per_setting(tmp_path: Path) -> None:
    # Prepare: a second-study tuning CSV with two settings whose picks differ
    from studies.confirmation.pages import tuning_summary

    folder = tmp_path / "confirm2-mnist"
    folder.mkdir()
    (folder / "tune-fltrust-validation.csv").write_text(
        "alpha,variant,seed,val_last5,picked\n"
        "0.1,fltrust-slr0.1,50,90.0,True\n0.1,fltrust-slr0.1,51,92.0,True\n"
        "0.1,fltrust-slr1,50,80.0,False\n0.1,fltrust-slr1,51,82.0,False\n"
        "0.01,fltrust-slr0.1,50,10.0,False\n0.01,fltrust-slr0.1,51,12.0,False\n"
        "0.01,fltrust-slr1,50,70.0,True\n0.01,fltrust-slr1,51,72.0,True\n")
    # Execute
    rows = [line for line in tuning_summary(tmp_path, "confirm2-") if line.startswith("| mnist")]
    # Assert: one row per setting x candidate, each setting's own mean and pick
    assert rows == [
        "| mnist, alpha=0.1 | tune-fltrust | fltrust-slr0.1 | 50: 90.00, 51: 92.00 | 91.00 | yes |",
        "| mnist, alpha=0.1 | tune-fltrust | fltrust-slr1 | 50: 80.00, 51: 82.00 | 81.00 |  |",
        "| mnist, alpha=0.01 | tune-fltrust | fltrust-slr0.1 | **50: 10.00**, **51: 12.00** "
        "| 11.00 |  |",  # below 20%: collapsed seeds in bold
        "| mnist, alpha=0.01 | tune-fltrust | fltrust-slr1 | 50: 70.00, 51: 72.00 | 71.00 | yes |"]
