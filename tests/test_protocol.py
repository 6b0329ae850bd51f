"""The confirmations' fixed points (studies.confirmation.protocol): fresh seeds, arm hashes that
name what each cell ran, and the check that reads them from committed files alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.presets import parse_preset


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
    from studies.confirmation.protocol import (
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
    from studies.confirmation.protocol import SECOND_CONFIRMATION_SEEDS, SECOND_PRESET_PREFIX

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


@pytest.mark.parametrize("study", ["confirm", "confirm2"])
def test_a_cell_records_the_config_hash_of_its_arm_in_the_protocol(
        study: str, shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: a two-arm confirm grid of the first or the second study; one of its cells runs
    # for real (in process, 1 round)
    from client_app.app import app as client_app
    from server_app.app import run
    from server_app.config import parse_run_config
    from sim.inline_grid import InProcessGrid
    from studies.confirmation.protocol import (
        ADDED_AFTER_PROTOCOL,
        check_cells,
        config_hash,
        protocol_arms,
    )

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


@pytest.mark.parametrize(("folder", "presets"), [("confirmation", "confirm"),
                                                  ("confirmation2", "confirm2")])
def test_the_committed_protocol_hashes_are_what_the_presets_resolve_to_today(
        folder: str, presets: str) -> None:
    # A key the app gains after a protocol commit must not move the hash that names an arm
    # (studies.confirmation.protocol.added_after); any other change to what an arm runs must.
    from sim.presets import load_preset
    from studies.confirmation.protocol import protocol_arms

    root = Path(__file__).resolve().parents[1]
    committed = {(a["preset"], a["arm"], a["setting"]): a["hash"] for a in json.loads(
        (root / "docs" / folder / "arms.json").read_text())}
    today = {(a["preset"], a["arm"], a["setting"]): a["hash"]
             for path in sorted((root / "conf" / presets).glob("*.toml"))
             for a in protocol_arms(load_preset(path))}
    assert today == committed and len(today) == 56


@pytest.mark.parametrize("study", ["first", "second"])
def test_check_from_committed_files_counts_what_it_checked(
        study: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A fresh clone's check restores the committed archive and rows itself; an empty results
    # folder is not a pass in silence: the count says nothing was found
    from studies.confirmation.pages import main

    preset = f"conf/{'confirm' if study == 'first' else 'confirm2'}/breastmnist.toml"
    # Execute
    committed = main(["check", "--study", study, preset, "--committed"])
    said = capsys.readouterr().out
    empty = main(["check", "--study", study, preset, "--results", str(tmp_path)])
    said_empty = capsys.readouterr().out
    # Assert: all 56 BreastMNIST cells carry their config record in the committed archive
    assert committed == 0 and "56 confirmation cells checked" in said
    assert "0 not found in the committed archives and rows" in said
    assert empty == 0 and "0 confirmation cells checked" in said_empty
    assert "56 not found in the results folder" in said_empty
