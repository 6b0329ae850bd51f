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
    import tomllib

    from sim.archives import MANIFEST, archived_files
    from sim.protocol import (
        CONFIRMATION_SEEDS,
        PRESET_PREFIX,
        SECOND_PRESET_PREFIX,
        TUNING_SEEDS,
    )

    root = Path(__file__).resolve().parents[1]
    used: set[int] = set()
    archives = []
    for manifest in sorted((root / "docs" / "results").glob(f"*/{MANIFEST}")):
        if manifest.parent.name.startswith((PRESET_PREFIX, SECOND_PRESET_PREFIX)):
            continue
        meta = json.loads(manifest.read_text())
        if "parts" in meta:  # committed in parts (sim.archives)
            archives.append(manifest)
            used |= {int(json.loads(data)["seed"])
                     for _, data in archived_files(manifest, "config.json")}
        else:  # archives that left git before issue 44: their manifest lists every grid point
            used |= {int(c["point"]["seed"]) for c in meta["cells"] if "seed" in c["point"]}
    presets = list((root / "conf").glob("*.toml"))
    for preset in presets:
        used |= _seeds_in(tomllib.loads(preset.read_text()))
    assert len(archives) >= 5 and len(presets) >= 10 and {0, 1, 2} <= used  # it looked
    assert not used & set(CONFIRMATION_SEEDS), sorted(used & set(CONFIRMATION_SEEDS))
    assert not used & set(TUNING_SEEDS), sorted(used & set(TUNING_SEEDS))
    # and the confirmations' presets tune on the tuning seeds only
    for preset in [*(root / "conf" / "confirm").glob("*.toml"),
                   *(root / "conf" / "confirm2").glob("*.toml")]:
        doc = tomllib.loads(preset.read_text())
        for grid in doc["grid"]:
            if grid.get("kind") == "tuning":
                assert set(grid["axes"]["seed"]) == set(TUNING_SEEDS), preset.name


def test_no_result_or_preset_but_the_second_confirmation_uses_its_seeds() -> None:
    # Seeds 200-207 are the second confirmation's (issue 46): no committed cell archive
    # (each cell's config.json), no preset and no grid of its own presets but its confirmation
    # grids may use them
    import tomllib

    from sim.archives import MANIFEST, archived_files
    from sim.protocol import SECOND_CONFIRMATION_SEEDS, SECOND_PRESET_PREFIX

    root = Path(__file__).resolve().parents[1]
    used: set[int] = set()
    for manifest in sorted((root / "docs" / "results").glob(f"*/{MANIFEST}")):
        if manifest.parent.name.startswith(SECOND_PRESET_PREFIX):
            continue  # its own reports: what its presets' grids (below) ran
        meta = json.loads(manifest.read_text())
        if "parts" in meta:
            used |= {int(json.loads(data)["seed"])
                     for _, data in archived_files(manifest, "config.json")}
        else:
            used |= {int(c["point"]["seed"]) for c in meta["cells"] if "seed" in c["point"]}
    presets = [*root.glob("conf/*.toml"), *root.glob("conf/confirm/*.toml")]
    for preset in presets:
        used |= _seeds_in(tomllib.loads(preset.read_text()))
    for preset in root.glob("conf/confirm2/*.toml"):
        doc = tomllib.loads(preset.read_text())
        used |= _seeds_in([g for g in doc["grid"] if g.get("kind") != "ablation"])
    assert {0, 50, 100} <= used  # it looked
    assert not used & set(SECOND_CONFIRMATION_SEEDS), sorted(used & set(SECOND_CONFIRMATION_SEEDS))


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


def test_the_committed_confirmation_report_regenerates_byte_identical(tmp_path: Path) -> None:
    # docs/confirmation.md and its hypotheses CSV from the committed CSVs alone: the
    # confirm-<dataset> reports are copied into a scratch docs/ and the page written there
    import shutil

    from sim.confirmation import write_confirmation
    from sim.protocol import PRESET_PREFIX

    docs = Path(__file__).resolve().parents[1] / "docs"
    for report in (docs / "results").glob(f"{PRESET_PREFIX}*"):
        shutil.copytree(report, tmp_path / "results" / report.name,
                        ignore=shutil.ignore_patterns("*.tar.gz", "*.json"))
    shutil.copytree(docs / "confirmation", tmp_path / "confirmation")
    write_confirmation(tmp_path / "results", tmp_path / "confirmation.md", tmp_path / "h.csv")
    assert (tmp_path / "confirmation.md").read_bytes() == (docs / "confirmation.md").read_bytes()
    assert (tmp_path / "h.csv").read_bytes() == (
        docs / "confirmation" / "hypotheses.csv").read_bytes()


@pytest.mark.parametrize("study", ["confirm", "confirm2"])
def test_a_cell_records_the_config_hash_of_its_arm_in_the_protocol(
        study: str, shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: a two-arm confirm grid of the first or the second study; one of its cells runs
    # for real (in process, 1 round)
    from client_app.app import app as client_app
    from server_app.app import run
    from server_app.config import parse_run_config
    from sim.inline_grid import InProcessGrid
    from sim.protocol import ADDED_AFTER_PROTOCOL, check_cells, config_hash, protocol_arms

    raw = {"preset": {"name": f"{study}-unit", "num-supernodes": 6, "backend": "inline"},
           "base": {"dataset": "mnist", "num-server-rounds": 1, "clients-per-round": 4,
                    "client-max-samples": 100, "test-max-samples": 200, "alpha": 10.0,
                    "imbalance-factor": 1.0},
           "variants": {"fedowen": {"strategy": "fedowen"},
                        "fedavg-equal": {"valuation": "none", "selection": "random",
                                         "aggregation": "uniform"}},
           "grid": [{"name": "confirm", "kind": "ablation", "reference": "fedowen",
                     "rows": "variant", "axes": {"seed": [100, 101],
                                                 "variant": ["fedowen", "fedavg-equal"]}}]}
    preset = parse_preset(raw)
    arms = protocol_arms(preset)
    cell = next(c for c in preset.cells() if c.point["variant"] == "fedowen")
    out = tmp_path / "res" / cell.cell_id
    # the first study's code ran the keys added since its protocol at their old values (today's
    # defaults differ); the second study's runs today's defaults
    legacy = {k.replace("_", "-"): v for k, v in ADDED_AFTER_PROTOCOL.items()}
    cfg = {**cell.run_config, "output-dir": str(out), "data-dir": str(shared_data_dir),
           **(legacy if study == "confirm" else {})}
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    # Execute
    run(InProcessGrid(client_app, nodes, cfg), parse_run_config(cfg), out)
    # Assert: one entry per arm (seeds together), full configs, defaults resolved
    assert [(a["arm"], a["seeds"]) for a in arms] == [("fedowen", [100, 101]),
                                                      ("fedavg-equal", [100, 101])]
    fedowen = arms[0]
    assert fedowen["run_config"]["norm_cap"] == "median"  # "auto" as it resolves today
    assert fedowen["run_config"]["valuation"] == "owen-antithetic"
    assert "seed" not in fedowen["run_config"] and len(fedowen["run_config"]) > 50
    recorded = json.loads((out / "config.json").read_text())
    assert check_cells(arms, preset, tmp_path / "res") == []
    if study == "confirm":
        assert config_hash(recorded) == fedowen["hash"] != arms[1]["hash"]
        # a config written before those keys existed names the same arm
        before = {k: v for k, v in recorded.items() if k not in ADDED_AFTER_PROTOCOL}
        assert config_hash(before) == fedowen["hash"]
        changes = ({"lr": 0.5}, {"value_cap_multiple": 1.0, "value_cap_mode": "exactly"})
    else:
        # what ships is what the protocol names: direction-only valuation, every key written
        assert fedowen["run_config"]["value_cap_multiple"] == 1.0
        assert fedowen["run_config"]["value_cap_mode"] == "exactly"
        changes = ({"lr": 0.5}, {"value_cap_multiple": 0.0, "value_cap_mode": "at-most"})
    # Assert: a cell that ran with another learning rate, or another value cap, is caught
    for changed in changes:
        (out / "config.json").write_text(json.dumps({**recorded, **changed}))
        assert any("config hash" in p for p in check_cells(arms, preset, tmp_path / "res"))


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


def test_the_committed_protocol_hashes_are_what_the_presets_resolve_to_today() -> None:
    # A key the app gains after the protocol commit must not move the hash that names an arm
    # (sim.protocol.ADDED_AFTER_PROTOCOL); any other change to what an arm runs must.
    from sim.presets import load_preset
    from sim.protocol import protocol_arms

    root = Path(__file__).resolve().parents[1]
    committed = {(a["preset"], a["arm"], a["setting"]): a["hash"] for a in json.loads(
        (root / "docs" / "confirmation" / "arms.json").read_text())}
    today = {(a["preset"], a["arm"], a["setting"]): a["hash"]
             for path in sorted((root / "conf" / "confirm").glob("*.toml"))
             for a in protocol_arms(load_preset(path))}
    assert today == committed and len(today) == 56


def test_check_from_committed_files_counts_what_it_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A fresh clone's check restores the committed archive and rows itself; an empty results
    # folder is not a pass in silence: the count says nothing was found
    from sim.confirmation import main

    preset = "conf/confirm/breastmnist.toml"
    # Execute
    committed = main(["check", preset, "--committed"])
    said = capsys.readouterr().out
    empty = main(["check", preset, "--results", str(tmp_path)])
    said_empty = capsys.readouterr().out
    # Assert: all 56 BreastMNIST cells carry their config record in the committed archive
    assert committed == 0 and "56 confirmation cells checked" in said
    assert "0 not found in the committed archives and rows" in said
    assert empty == 0 and "0 confirmation cells checked" in said_empty
    assert "56 not found in the results folder" in said_empty


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
