"""The per-round curves of a backdoor-defaults preset (studies.backdoor.curves): rows per cell
round, means over seeds per setting, attack and arm, and the PNG drawn from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.compact import open_csv
from sim.presets import load_preset
from sim.results import CellResult
from studies.backdoor.curves import FIELDS, drawn, round_rows, write_curves
from studies.backdoor.defaults_rule import attack_of


@pytest.fixture(scope="module")
def results() -> dict[str, CellResult]:
    """Three rounds for each fedowen and alignins-2 cell of MNIST alpha 0.1 (square and clean):
    ASR 10 x seed + round, validation 80 + seed."""
    cells = [c for c in load_preset("conf/backdoor-defaults-dev.toml").cells()
             if c.config.dataset == "mnist" and c.config.alpha == 0.1
             and c.grid in ("square-lenet", "clean-lenet")
             and c.point["variant"] in ("fedowen", "alignins-2")]
    out = {}
    for c in cells:
        s = c.config.seed
        rounds = [{"round": 0, "test_accuracy": 0.1}] + [
            {"round": k, "val_accuracy": (80 + s) / 100, "test_accuracy": 0.5,
             "attack_success": (10 * s + k) / 100 if c.config.adversary_fraction else None}
            for k in (1, 2, 3)]
        out[c.cell_id] = CellResult(c, rounds)
    return out


def test_rows_are_one_per_cell_round_and_means_are_over_seeds(results) -> None:
    # Execute
    rows = round_rows(results, attack_of)
    curves = drawn(rows)
    # Assert: 2 arms x (3 attacked + 5 clean seeds) x 3 rounds; ASR mean of seeds 0-2 at
    # round 2 is (2 + 12 + 22) / 3; validation drawn for the clean cells only
    assert len(rows) == 2 * (3 + 5) * 3
    x, y, n = curves["asr"][(("mnist", 0.1), "square", "alignins-2")]
    assert list(x) == [1, 2, 3] and y[1] == pytest.approx(12.0) and list(n) == [3, 3, 3]
    assert set(curves["asr"]) == {(("mnist", 0.1), "square", a) for a in ("fedowen",
                                                                          "alignins-2")}
    x, y, n = curves["val"][(("mnist", 0.1), "clean", "fedowen")]
    assert y[0] == pytest.approx(82.0) and n[0] == 5
    assert (("mnist", 0.1), "square", "fedowen") not in curves["val"]


def test_write_curves_writes_what_it_draws_beside_the_png(results, tmp_path: Path) -> None:
    # Execute
    written = write_curves(results, ["fedowen", "alignins-2"], tmp_path, attack_of)
    # Assert: 2 arms x (square ASR + clean val) x 3 rounds, each with its mean and seeds
    assert [p.name for p in written] == ["curves.csv.gz", "curves.png"]
    with open_csv(tmp_path / "curves.csv.gz") as fh:
        lines = fh.read().splitlines()
    assert lines[0] == ",".join(FIELDS) and len(lines) == 1 + 12
    assert "mnist,0.1,square,alignins-2,asr,2,12.00,3" in lines
    assert "mnist,0.1,clean,fedowen,val,1,82.00,5" in lines
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert write_curves({}, ["fedowen"], tmp_path / "none", attack_of) == []
