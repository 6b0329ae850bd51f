"""The second confirmation's picks (studies.confirmation.picks): the rules of its protocol's
section 4."""

from __future__ import annotations

import json
from pathlib import Path

from sim.grid import app_config
from studies.confirmation.picks import SELECTOR_KEY, Pick, gather, setting_picks, write


def tuned(**scores: float) -> dict[str, Pick]:
    return {grid: Pick(f"{grid}-best", score, "test") for grid, score in scores.items()}


def test_the_better_family_and_the_better_selector_are_the_higher_scores() -> None:
    # Prepare: FedProx's pick above FedAvgM's; Oort's above Power-of-Choice's (selection-dev)
    dev = {"power-of-choice": Pick("poc-d20", 75.0, "dev"), "oort": Pick("oort-x0.1", 77.0, "dev")}
    # Execute
    picks = setting_picks(tuned(**{"tune-fedavgm": 80.0, "tune-fedprox": 82.0,
                                   "tune-fltrust": 70.0}), dev)
    # Assert
    assert picks["fedavg-tuned"].candidate == "tune-fedprox-best"
    assert picks["fltrust"].score == 70.0 and picks[SELECTOR_KEY] == "oort"
    assert "missing" not in picks
    # a tie goes to the first listed: FedAvgM, Power-of-Choice
    tie = setting_picks(tuned(**{"tune-fedavgm": 80.0, "tune-fedprox": 80.0, "tune-fltrust": 1.0,
                                 "tune-poc": 60.0, "tune-oort": 60.0}), None)
    assert tie["fedavg-tuned"].candidate == "tune-fedavgm-best"
    assert tie[SELECTOR_KEY] == "power-of-choice"
    assert tie["oort"].candidate == "tune-oort-best"


def test_picks_json_is_written_only_when_every_setting_has_every_pick(tmp_path: Path) -> None:
    full = setting_picks(tuned(**{"tune-fedavgm": 1.0, "tune-fedprox": 2.0, "tune-fltrust": 3.0,
                                  "tune-poc": 5.0, "tune-oort": 4.0}), None)
    part = setting_picks(tuned(**{"tune-fedavgm": 1.0}), None)
    assert part["missing"] == ["tune-fedprox", "tune-fltrust", "tune-poc/tune-oort"]
    paths = write({"mnist": {"alpha=0.1": full, "alpha=0.01": part}}, tmp_path)
    assert [p.name for p in paths] == ["picks.md"]
    assert "| mnist | alpha=0.01 | not yet | tune-fedprox" in paths[0].read_text()
    paths = write({"mnist": {"alpha=0.1": full}}, tmp_path)
    assert json.loads((tmp_path / "picks.json").read_text()) == {
        "mnist": {"alpha=0.1": {SELECTOR_KEY: "power-of-choice"}}}


def test_before_any_tuning_cell_every_setting_waits(tmp_path: Path) -> None:
    # the eight settings of conf/confirm2, nothing run: each names what it waits for
    picks = gather(tmp_path, tmp_path / "no-selection-results")
    settings = [(d, s) for d, by in picks.items() for s in by]
    assert len(settings) == 8
    assert all("missing" in picks[d][s] for d, s in settings)
    assert picks["mnist"]["alpha=0.1"]["missing"][-1] == "selection-dev"  # it covered MNIST
    assert picks["breastmnist"]["all"]["missing"][-1] == "tune-poc/tune-oort"


def test_the_confirm_block_runs_each_settings_own_picks() -> None:
    # Prepare: MNIST picks that differ by alpha for the tuned baseline and Power-of-Choice
    import tomllib

    from sim.presets import load_preset, parse_preset
    from studies.confirmation.picks import confirm_block
    from studies.confirmation.protocol import SECOND_CONFIRMATION_SEEDS

    root = Path(__file__).resolve().parents[1]
    preset = load_preset(root / "conf" / "confirm2" / "mnist.toml")
    dev = load_preset(root / "conf" / "selection-dev.toml")

    def picks(avg: str, poc: str) -> dict[str, object]:
        return {"fedavg-tuned": Pick(avg, 1.0, "t"), "fltrust": Pick("fltrust-slr0.3", 1.0, "t"),
                "power-of-choice": Pick(poc, 1.0, "d"), "oort": Pick("oort-x0.3", 1.0, "d"),
                SELECTOR_KEY: "oort"}

    by_setting = {"alpha=0.1": picks("fedavgm-slr1.0-sm0.5-equal", "poc-d20"),
                  "alpha=0.01": picks("fedprox-mu0.1-equal", "poc-d50")}
    # Execute
    block = confirm_block(preset, by_setting, list(SECOND_CONFIRMATION_SEEDS), dev)
    tuning = (root / "conf" / "confirm2" / "mnist.toml").read_text()
    tuning = tuning.split("# The second confirmation's arms and grid")[0]  # the frozen block
    text = tuning + "\n" + block
    confirm = [c for c in parse_preset(tomllib.loads(text)).cells() if c.grid == "confirm"]
    # Assert: 7 arms x 2 settings x 8 seeds; each setting runs its own pick, whole
    assert len(confirm) == 112
    at = {(c.point["variant"], c.point["alpha"]): c.run_config for c in confirm}
    assert at["fedavg-tuned", 0.1]["strategy"] == "fedavgm"
    assert "server_momentum=0.5" in at["fedavg-tuned", 0.1]["strategy-params"]
    assert at["fedavg-tuned", 0.01]["strategy"] == "fedprox"
    assert at["fedavg-tuned", 0.01]["proximal-mu"] == 0.1
    assert at["fedavg-tuned", 0.01]["strategy-params"] == "weighted_by_key=unit-weight"
    assert at["fedavg-tuned", 0.1]["proximal-mu"] == 0.0  # the app's default, set explicitly
    assert (at["power-of-choice", 0.1]["poc-d"], at["power-of-choice", 0.01]["poc-d"]) == (20, 50)
    assert at["fltrust", 0.1]["fltrust-server-lr"] == at["fltrust", 0.01]["fltrust-server-lr"]
    # FedOwen as shipped: only its selection written, as the app's default resolves today
    assert {k for k in at["fedowen", 0.1]} == {k for k in preset.base} | {"seed", "alpha",
                                                                          "selection"}
    assert at["fedowen", 0.1]["selection"] == app_config({}).choices().selection


def test_selection_devs_tuned_peers_become_the_selector_picks_where_it_covered() -> None:
    # Prepare: selection-dev's MNIST alpha=0.1 peers on seeds 0-4 (d = 50 and floor 0.1 best on
    # validation); every other cell unfinished
    from sim.presets import load_preset
    from sim.results import CellResult
    from studies.confirmation.picks import selection_picks

    dev = load_preset(Path(__file__).resolve().parents[1] / "conf" / "selection-dev.toml")
    val = {"poc-d20": 0.80, "poc-d50": 0.82, "oort-x0.3": 0.78, "oort-x0.1": 0.79}
    res = {}
    for cell in dev.cells():
        arm = cell.point.get("variant")
        mnist01 = cell.grid == "mnist" and cell.point.get("alpha") == 0.1
        rounds = ([{"round": r, "val_accuracy": val[arm], "test_accuracy": 0.5}
                   for r in range(101)] if mnist01 and arm in val else [])
        res[cell.cell_id] = CellResult(cell, rounds)
    # Execute
    picks = selection_picks(dev, res)
    # Assert: only the covered setting, keyed as the confirm grid labels it
    assert list(picks) == [("mnist", "alpha=0.1")]
    got = picks[("mnist", "alpha=0.1")]
    assert (got["power-of-choice"].candidate, got["oort"].candidate) == ("poc-d50", "oort-x0.1")
    assert got["power-of-choice"].score == 82.0


def test_the_confirm_arms_run_the_committed_tuning_picks() -> None:
    # Every tuned arm of every conf/confirm2 confirm grid is, at each setting, the candidate its
    # committed tuning CSV picked there on validation, value for value; fedavg-tuned is the
    # better of the FedAvgM and FedProx picks (a tie: FedAvgM)
    import csv

    from sim.presets import load_preset
    from sim.results import point_label

    root = Path(__file__).resolve().parents[1]
    arm_of = {"tune-fltrust": "fltrust", "tune-poc": "power-of-choice", "tune-oort": "oort"}
    checked = 0
    for path in sorted((root / "conf" / "confirm2").glob("*.toml")):
        preset = load_preset(path)
        keys = preset.grid("confirm").column_keys
        arms = {(c.point["variant"], point_label({k: c.point[k] for k in keys})): c.run_config
                for c in preset.cells() if c.grid == "confirm"}
        picks: dict[tuple[str, str], tuple[str, float]] = {}
        for grid in (g.name for g in preset.grids if g.kind == "tuning"):
            csv_path = root / "docs" / "results" / preset.name / f"{grid}-validation.csv"
            with csv_path.open() as fh:
                rows = list(csv.DictReader(fh))
            for setting in {point_label({k: r[k] for k in keys}) for r in rows}:
                chosen = [r for r in rows if r["picked"] == "True"
                          and point_label({k: r[k] for k in keys}) == setting]
                assert len({r["variant"] for r in chosen}) == 1, (preset.name, grid, setting)
                picks[grid, setting] = (chosen[0]["variant"],
                                        sum(float(r["val_last5"]) for r in chosen) / len(chosen))
        for (grid, setting), (variant, score) in picks.items():
            arm = arm_of.get(grid)
            if arm is None:  # FedAvgM or FedProx: only the better family's pick is an arm
                other = picks[("tune-fedprox" if grid == "tune-fedavgm" else "tune-fedavgm",
                               setting)][1]
                if score < other or (score == other and grid == "tune-fedprox"):
                    continue
                arm = "fedavg-tuned"
            assert preset.variants[variant].items() <= arms[arm, setting].items(), (
                preset.name, setting, arm, variant)
            checked += 1
    # 8 settings x (fedavg-tuned, fltrust), and both selectors where the preset tunes them
    # (BreastMNIST, CIFAR-10 alpha 0.01)
    assert checked == 8 * 2 + 2 * 2
