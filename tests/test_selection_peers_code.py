"""selection-peers-code's rule and reading (studies.selection.peers_code*) on hand-built scores
and records: the code forms tuned, the best peer of either reading (ties to the earlier grid's),
the adopted default held against it, leave one seed out, the anchor against
selection-peers-dev, a partial grid through the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.results import CellResult
from studies.selection.peers_code_rule import kept_code, leave_one_out_code, read_code
from tests.test_selection_peers import PEERS_LOW, by_seed, cell_rounds, score, setting

#: Contenders level with fedowen-random and the earlier best peer (so none fails there).
EARLIER = {**PEERS_LOW, "poc-d50": 80.0, "fedowen-random": 70.0}


def test_the_code_forms_widen_the_best_peer_and_the_adopted_default_is_held_against_it(
        ) -> None:
    # Prepare: in a, hics-code's 0.1 (84) above the earlier best (poc-d50, 80) and delta-code
    # (82): Algorithm 2 (83) 1 point below it, level with nothing else; in b, delta-code ties
    # the earlier best (80 each): the earlier arm stays best
    a = setting("a", {**EARLIER, "delta-code": 82, "hics-code-t0.03": 79, "hics-code-t0.1": 84,
                      "fedowen": 83, "hics-phi": 81, "delta-phi": 80})
    b = setting("b", {**EARLIER, "delta-code": 80, "hics-code-t0.03": 70, "hics-code-t0.1": 75,
                      "fedowen": 81, "hics-phi": 80, "delta-phi": 80})
    reference = {"a": "poc-d50", "b": "poc-d50"}
    # Execute
    reading = read_code([a, b], reference, total=2)
    # Assert: tuned and best by hand; Algorithm 2 adopted by the earlier rule (eligible there,
    # the highest mean), short of the code form in a only
    assert reading.tuned == {"a": {"delta-code": "delta-code", "hics-code": "hics-code-t0.1"},
                             "b": {"delta-code": "delta-code", "hics-code": "hics-code-t0.1"}}
    assert reading.earlier.best == {"a": "poc-d50", "b": "poc-d50"}
    assert reading.best == {"a": "hics-code-t0.1", "b": "poc-d50"}
    assert reading.adopted == "fedowen"
    assert [(name, iv.mean, iv.half) for name, iv in reading.short()] == [("a", -1.0, 0.0)]
    assert reading.vs_best["b"]["fedowen"].mean == pytest.approx(1.0)
    assert [name for name, _ in reading.below("delta-phi")] == ["a"]
    # before the earlier grid adopts a default there is nothing to hold against the best peer
    assert read_code([a, b], reference, total=3).short() == []


def test_leave_one_seed_out_rereads_both_grids() -> None:
    # Prepare: hics-code's 0.1 ahead only through seed 0 (90 vs 81 there; 80 vs 81 without it),
    # which also makes it the best peer; the earlier best otherwise (poc-d50, 85)
    s = by_seed("femnist", {
        **{arm: [v] * 5 for arm, v in EARLIER.items()}, "poc-d50": [85] * 5,
        "delta-code": [60] * 5, "hics-code-t0.03": [81] * 5, "hics-code-t0.1": [90, 80, 80, 80, 80],
        "fedowen": [84] * 5, "hics-phi": [84] * 5, "delta-phi": [70] * 5})
    reference = {"femnist": "poc-d50"}
    # Execute
    full = read_code([s], reference, total=1)
    counts = kept_code(full, leave_one_out_code([s], reference, range(5), total=1))
    # Assert
    assert full.tuned["femnist"]["hics-code"] == "hics-code-t0.1"
    assert counts["femnist: hics-code tuned"] == ("hics-code-t0.1", 4)
    assert counts["femnist: best peer"] == ("poc-d50", 5)
    assert counts["femnist: delta-phi vs best peer"] == ("below", 5)
    assert counts["femnist: fedowen vs best peer"] == ("below", 5)
    assert counts["adopted (selection-peers-dev)"] == ("fedowen", 5)
    assert "femnist: delta-code tuned" not in counts  # no knob, no decision


def test_a_partial_grid_reads_the_settings_both_grids_finished(tmp_path: Path) -> None:
    from sim.presets import load_preset
    from studies.selection.peers_code import write
    from studies.selection.peers_code_data import merge
    from studies.selection.peers_data import collect, group

    # Prepare: selection-dev complete; selection-peers-dev complete on FEMNIST and MNIST alpha
    # 0.1; this grid complete on both, its anchor reproduced on FEMNIST and 0.01 points off in
    # MNIST alpha 0.1's seed 3
    preset = load_preset(Path("conf/selection-peers-code.toml"))
    earlier = load_preset(Path("conf/selection-peers-dev.toml"))
    dev = load_preset(Path("conf/selection-dev.toml"))
    dev_res = {c.cell_id: CellResult(c, cell_rounds(score(c), score(c) - 1)) for c in dev.cells()}

    def name_of(c):
        return c.grid + ("" if c.grid == "femnist" else f" {c.config.alpha:g}")

    e_res = {c.cell_id: CellResult(c, cell_rounds(score(c), score(c) - 1)
                                   if name_of(c) in ("femnist", "mnist 0.1") else [])
             for c in earlier.cells()}
    res = {}
    for c in preset.cells():
        off = 0.01 if (name_of(c), c.point["variant"], c.config.seed) == (
            "mnist 0.1", "fedowen-random", 3) else 0.0
        ran = name_of(c) in ("femnist", "mnist 0.1")
        res[c.cell_id] = CellResult(c, cell_rounds(score(c) + off, score(c) - 1) if ran else [])
    found = [merge(d, group(preset, res).get(d.name, {}), preset.num_supernodes)
             for d in collect(group(earlier, e_res), group(dev, dev_res), 100)]
    # Execute
    paths = write(preset, found, res, tmp_path, "python -m studies.selection.peers_code test")
    # Assert: FEMNIST read; hics-code's 0.03 (the longer name, 75) above the earlier best
    # (greedyfed-mean, 74, the first listed of two) and every contender below it
    by_name = {c.data.name: c for c in found}
    assert [c.data.name for c in found if c.decided] == ["femnist"]
    assert by_name["mnist alpha=0.1"].data.anchor.status == "differs"
    assert set(by_name["mnist alpha=0.1"].data.sources.values()) == {"here"}
    assert by_name["mnist alpha=0.01"].data.anchor.status == "pending"
    assert by_name["femnist"].data.sources["hics-phi"] == "selection-peers-dev"
    assert by_name["femnist"].data.sources["oort-x0.1"] == "selection-dev"
    data = json.loads((tmp_path / "selection-code-decisions.json").read_text())
    femnist = data["settings"]["femnist"]
    assert femnist["earlier_best_peer"] == "greedyfed-mean"
    assert femnist["best_peer"] == "hics-code-t0.03" and femnist["best_peer_from"] == "here"
    assert femnist["vs_best_peer"]["fedowen"][0] == pytest.approx(-8.0)
    assert data["adopted"] is None and data["adopted_short"] == []
    page = (tmp_path / "selection-code.md").read_text()
    assert "(partial: 40 of 120 cells finished)" in page
    assert "Step 2, best peer of either reading: **hics-code-t0.03**" in page
    assert "The anchor **differs** from selection-peers-dev" in page
    assert "selection-peers-dev has adopted no default yet" in page
    names = {p.name for p in paths}
    assert {"selection-code-femnist-rounds.csv.gz", "selection-code-femnist-val.png",
            "selection-code-arms.csv", "selection-code-anchor.csv"} <= names
    assert "selection-code-cifar10-alpha0.1-val.png" not in names
