"""The confirmation's tuning (sim.confirmation): picked by validation accuracy, never test."""

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
    from sim.hypotheses import ENDPOINT_ROUNDS
    from sim.presets import load_preset
    from sim.protocol import SECOND_PRESET_PREFIX, TUNING_SEEDS
    from sim.tuning import BETTER_OF

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


ARM_LEVELS = {"fedowen": 80.0, "fedavg-equal": 78.0, "fedavgm": 79.0, "fedprox": 81.0,
              "fltrust": 86.0, "fedavg-samples": 80.0, "fedowen-random": 79.5}


def write_confirm_rounds(path: Path, settings: list[str], seeds: range | tuple[int, ...],
                         levels: dict[str, float] | None = None) -> None:
    """An ablation report's rounds CSV: every arm at its level, a shared per-seed offset (so
    the pairing matters) and a small arm-by-seed wobble."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["variant", "column", "seed", "round",
                                                "test_accuracy"])
        writer.writeheader()
        for setting in settings:
            for i, (arm, level) in enumerate((levels or ARM_LEVELS).items()):
                for seed in seeds:
                    shared, wobble = 3.0 * ((seed * 7) % 5), 0.3 * (((seed + i) * 3) % 4)
                    for rnd in range(101):
                        acc = level + shared + wobble if rnd > 0 else 10.0
                        writer.writerow({"variant": arm, "column": setting, "seed": seed,
                                         "round": rnd, "test_accuracy": round(acc, 2)})


def test_the_confirmation_report_decides_by_holm_and_regenerates_byte_identical(
        tmp_path: Path) -> None:
    # Prepare: two datasets; FedOwen is 2 points above equal-weight FedAvg, below FedProx
    # (the better of FedAvgM and FedProx) and 6 below FLTrust
    from sim.confirmation import write_confirmation
    from sim.hypotheses import read_endpoints
    from sim.protocol import CONFIRMATION_SEEDS
    from sim.stats import holm

    results = tmp_path / "results"
    write_confirm_rounds(results / "confirm-mnist" / "confirm-rounds.csv",
                         ["alpha=0.01", "alpha=0.1"], CONFIRMATION_SEEDS)
    write_confirm_rounds(results / "confirm-femnist" / "confirm-rounds.csv", ["all"],
                         CONFIRMATION_SEEDS)
    out_md, out_csv = tmp_path / "docs" / "confirmation.md", tmp_path / "docs" / "h.csv"
    # Execute
    write_confirmation(results, out_md, out_csv)
    first = out_md.read_bytes(), out_csv.read_bytes()
    write_confirmation(results, out_md, out_csv)
    # Assert: byte-identical, complete, every primary of 3 settings x 3 hypotheses decided
    assert (out_md.read_bytes(), out_csv.read_bytes()) == first
    with out_csv.open() as fh:
        rows = list(csv.DictReader(fh))
    primary = [r for r in rows if r["family"] == "primary"]
    assert len(primary) == 9 and len(rows) == 15
    assert "Status: complete." in out_md.read_text()
    decisions = {(r["dataset"], r["setting"], r["against"]): r["decision"] for r in primary}
    assert decisions[("mnist", "alpha=0.1", "fedavg-equal")] == "confirmed"
    assert decisions[("mnist", "alpha=0.1", "fedprox")] == "reversed"  # the better one
    assert decisions[("femnist", "all", "fltrust")] == "reversed"
    # the endpoint is the mean of rounds 96-100 and the difference is paired
    endpoints = read_endpoints(results / "confirm-mnist" / "confirm-rounds.csv")
    ours, theirs = endpoints[("fedowen", "alpha=0.1")], endpoints[("fedavg-equal", "alpha=0.1")]
    diff = next(r for r in primary if r["against"] == "fedavg-equal")
    assert float(diff["mean_diff"]) == pytest.approx(
        sum(ours[s] - theirs[s] for s in ours) / 8, abs=1e-4)
    # Holm over the whole primary family, in the family's order
    raw = [float(r["p_t"]) for r in primary]
    assert [float(r["p_holm"]) for r in primary] == pytest.approx(holm(raw), abs=1e-4)


def test_the_second_confirmation_compares_with_the_selector_the_protocol_picked(
        tmp_path: Path) -> None:
    # Prepare: Oort's endpoint is the higher on the scored seeds, but the protocol picked
    # Power-of-Choice on validation at alpha=0.1 (and Oort at alpha=0.01)
    from sim.confirmation import write_confirmation
    from sim.hypotheses import SECOND
    from sim.protocol import SECOND_CONFIRMATION_SEEDS

    levels = {"fedowen": 80.0, "fedavg-equal": 78.0, "fedavg-tuned": 79.0, "fltrust": 76.0,
              "power-of-choice": 77.0, "oort": 83.0, "fedowen-random": 79.5}
    results = tmp_path / "results"
    write_confirm_rounds(results / "confirm2-mnist" / "confirm-rounds.csv",
                         ["alpha=0.01", "alpha=0.1"], SECOND_CONFIRMATION_SEEDS, levels)
    write_confirm_rounds(results / "confirm-mnist" / "confirm-rounds.csv", ["alpha=0.1"],
                         range(100, 108))  # the first confirmation's: not read here
    folder = tmp_path / "confirmation2"
    folder.mkdir()
    picks = {"mnist": {"alpha=0.1": {"power-of-choice+oort": "power-of-choice"},
                       "alpha=0.01": {"power-of-choice+oort": "oort"}}}
    (folder / "picks.json").write_text(json.dumps(picks))
    # Execute
    write_confirmation(results, tmp_path / "confirmation2.md", tmp_path / "h.csv", SECOND)
    # Assert: 2 settings x 4 primaries; the picked selector is the comparison, the other one
    # a secondary; four columns in the per-dataset table
    with (tmp_path / "h.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    primary = {(r["setting"], r["against"]): r["decision"] for r in rows
               if r["family"] == "primary"}
    assert len(primary) == 8 and ("alpha=0.1", "power-of-choice") in primary
    assert primary[("alpha=0.1", "power-of-choice")] == "confirmed"
    assert primary[("alpha=0.01", "oort")] == "reversed"
    secondary = {(r["setting"], r["against"]) for r in rows if r["family"] == "secondary"}
    assert secondary == {("alpha=0.1", "oort"), ("alpha=0.01", "power-of-choice"),
                         ("alpha=0.1", "fedowen-random"), ("alpha=0.01", "fedowen-random")}
    text = (tmp_path / "confirmation2.md").read_text()
    assert text.startswith("# The second pre-registered confirmation")
    assert "| vs FLTrust | vs the better selector | verdict |" in text
    assert "all four primaries" in text and "--study second" in text
    # without the protocol's pick the report refuses, naming what to write
    (folder / "picks.json").unlink()
    with pytest.raises(ValueError, match=r"no pick among .* picks\.json"):
        write_confirmation(results, tmp_path / "confirmation2.md", tmp_path / "h.csv", SECOND)


def test_the_per_dataset_verdict_follows_the_protocols_rule() -> None:
    from sim.hypotheses import verdict

    assert verdict(["confirmed"] * 6) == "confirmed"
    assert verdict(["confirmed", "not confirmed", "confirmed"]) == "partly confirmed"
    assert verdict(["not confirmed"] * 3) == "not confirmed"
    assert verdict(["confirmed", "reversed", "confirmed"]) == (
        "reversed (2 of 3 primaries confirmed)")


def test_a_confirmation_missing_a_planned_setting_is_interim_and_its_dataset_pending(
        tmp_path: Path) -> None:
    # Prepare: every seed of MNIST alpha=0.1, but the protocol also plans alpha=0.01
    from sim.confirmation import write_confirmation
    from sim.protocol import CONFIRMATION_SEEDS

    results = tmp_path / "results"
    write_confirm_rounds(results / "confirm-mnist" / "confirm-rounds.csv", ["alpha=0.1"],
                         CONFIRMATION_SEEDS)
    (tmp_path / "confirmation").mkdir()
    (tmp_path / "confirmation" / "arms.json").write_text(json.dumps(
        [{"preset": "confirm-mnist", "setting": s, "arm": "fedowen"}
         for s in ("alpha=0.1", "alpha=0.01")]))
    # Execute
    write_confirmation(results, tmp_path / "confirmation.md", tmp_path / "h.csv")
    # Assert
    text = (tmp_path / "confirmation.md").read_text()
    assert "**interim**: 1 of 2 settings" in text
    assert "| mnist | alpha=0.1 | confirmed | reversed (fedprox) | reversed | pending " \
           "(alpha=0.01 not run yet) |" in text


def test_an_unfinished_confirmation_is_labelled_interim(tmp_path: Path) -> None:
    from sim.confirmation import write_confirmation

    results = tmp_path / "results"
    write_confirm_rounds(results / "confirm-mnist" / "confirm-rounds.csv", ["alpha=0.1"],
                         range(100, 104))
    write_confirmation(results, tmp_path / "c.md", tmp_path / "h.csv")
    text = (tmp_path / "c.md").read_text()
    assert "**interim**" in text
    assert "## Deviations\n\nNone" in text
    # a departure written beside the protocol is carried into the report
    (tmp_path / "confirmation").mkdir()
    (tmp_path / "confirmation" / "deviations.md").write_text("- Seed 103 of X: node lost.\n")
    write_confirmation(results, tmp_path / "c.md", tmp_path / "h.csv")
    assert "## Deviations\n\n- Seed 103 of X: node lost.\n" in (tmp_path / "c.md").read_text()


@pytest.mark.parametrize("study", ["first", "second"])
def test_the_committed_confirmation_report_regenerates_byte_identical(
        study: str, tmp_path: Path) -> None:
    # docs/confirmation.md (confirmation2.md) and its hypotheses CSV from the committed CSVs
    # alone: the study's reports are copied into a scratch docs/ and the page written there
    import shutil

    from sim.confirmation import write_confirmation
    from sim.hypotheses import STUDIES

    known = STUDIES[study]
    docs = Path(__file__).resolve().parents[1] / "docs"
    for report in (docs / "results").glob(f"{known.prefix}*"):
        shutil.copytree(report, tmp_path / "results" / report.name,
                        ignore=shutil.ignore_patterns("*.tar.gz", "*.json"))
    shutil.copytree(docs / known.folder, tmp_path / known.folder)
    page = f"{known.folder}.md"
    write_confirmation(tmp_path / "results", tmp_path / page, tmp_path / "h.csv", known)
    assert (tmp_path / page).read_bytes() == (docs / page).read_bytes()
    assert (tmp_path / "h.csv").read_bytes() == (
        docs / known.folder / "hypotheses.csv").read_bytes()


def test_every_arms_endpoint_is_listed_and_a_collapsed_arm_is_marked() -> None:
    from sim.confirmation import arm_endpoints

    healthy = {s: 90.0 + s % 2 for s in (100, 101)}
    table = {("fedowen", "alpha=0.01"): healthy, ("fedavg-equal", "alpha=0.01"): healthy,
             ("fedavgm", "alpha=0.01"): {100: 27.6, 101: 9.9}}  # one seed at chance
    md = "\n".join(arm_endpoints({"mnist": table}))
    row = next(line for line in md.splitlines() if line.startswith("| mnist |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # dataset, setting, then fedowen, fedavg-equal, fedavgm, fedprox, ...: mean (lowest seed)
    assert cells[2:6] == ["90.5 (90.0)", "90.5 (90.0)", "**18.8 (9.9)**", "-"]


def test_the_tuning_table_picks_per_setting(tmp_path: Path) -> None:
    # Prepare: a second-study tuning CSV with two settings whose picks differ
    from sim.confirmation import tuning_summary

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
        "| mnist, alpha=0.01 | tune-fltrust | fltrust-slr0.1 | 50: 10.00, 51: 12.00 | 11.00 |  |",
        "| mnist, alpha=0.01 | tune-fltrust | fltrust-slr1 | 50: 70.00, 51: 72.00 | 71.00 | yes |"]
