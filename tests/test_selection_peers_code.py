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


def name_of(cell) -> str:
    """A cell's setting as the fixtures name it: ``femnist``, ``mnist 0.01``, ..."""
    return cell.grid + ("" if cell.grid == "femnist" else f" {cell.config.alpha:g}")


def three_presets():
    """This grid's, selection-peers-dev's and selection-dev's presets, and selection-dev's
    cells all finished at :func:`score`."""
    from sim.presets import load_preset

    preset = load_preset(Path("conf/selection-peers-code.toml"))
    earlier = load_preset(Path("conf/selection-peers-dev.toml"))
    dev = load_preset(Path("conf/selection-dev.toml"))
    dev_res = {c.cell_id: CellResult(c, cell_rounds(score(c), score(c) - 1)) for c in dev.cells()}
    return preset, earlier, dev, dev_res


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
    # Prepare: hics-code's 0.1 ahead only through seed 0 (mean 82 vs 81; 80 vs 81 without
    # seed 0), never the best peer: the earlier best (poc-d50, 85) in every reading. Algorithm 2
    # and hics-phi (84) fail level in the earlier rule; the tie goes to fedowen (listed first)
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
    from studies.selection.peers_code import write
    from studies.selection.peers_code_data import merge
    from studies.selection.peers_data import collect, group

    # Prepare: selection-dev complete; selection-peers-dev complete on FEMNIST and MNIST alpha
    # 0.1; this grid complete on both, its anchor reproduced on FEMNIST and 0.01 points off in
    # MNIST alpha 0.1's seed 3
    preset, earlier, dev, dev_res = three_presets()

    e_res = {c.cell_id: CellResult(c, cell_rounds(score(c), score(c) - 1)
                                   if name_of(c) in ("femnist", "mnist 0.1") else [])
             for c in earlier.cells()}
    res = {}
    for c in preset.cells():
        off = 0.01 if (name_of(c), c.point["variant"], c.config.seed) == (
            "mnist 0.1", "fedowen-random", 3) else 0.0
        ran = name_of(c) in ("femnist", "mnist 0.1")
        rounds = cell_rounds(score(c) + off, score(c) - 1) if ran else []
        if (name_of(c), c.point["variant"], c.config.seed) == ("femnist", "delta-code", 2):
            rounds = rounds[:61]  # stopped after round 60: no round accepted an update
        res[c.cell_id] = CellResult(c, rounds)
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
    assert "(partial: 39 of 120 cells finished)" in page
    # the stopped cell is scored (FEMNIST still read), not missing, and listed
    assert by_name["femnist"].stopped == ("delta-code seed=2 at round 60",)
    assert "## Cells the app stopped" in page and "- femnist: delta-code seed=2 at round 60" in page
    assert by_name["femnist"].data.setting.scores["delta-code"]["val_accuracy"][2] == (
        pytest.approx(70.5))
    assert "Step 2, best peer of either reading: **hics-code-t0.03**" in page
    assert "The anchor **differs** from selection-peers-dev" in page
    assert "selection-peers-dev has adopted no default yet" in page
    names = {p.name for p in paths}
    assert {"selection-code-femnist-rounds.csv.gz", "selection-code-femnist-val.png",
            "selection-code-arms.csv", "selection-code-anchor.csv"} <= names
    assert "selection-code-cifar10-alpha0.1-val.png" not in names


def three_grids(earlier_ran: set[str], mine_ran: set[str], earlier_skip=(), mine_skip=(),
                mine_round_50: float = 0.0):
    """selection-dev complete; selection-peers-dev's cells finished in the settings
    ``earlier_ran``, this grid's in ``mine_ran`` (``*_skip``: (setting, arm, seed) left
    unfinished); this grid's fedowen-random ``mine_round_50`` points off in round 50 only (its
    final round, hence the anchor, unchanged). Returns the presets, this grid's cells and the
    settings merged."""
    from studies.selection.peers_code_data import merge
    from studies.selection.peers_data import collect, group

    preset, earlier, dev, dev_res = three_presets()

    def ran(c, settings, skip):
        return (name_of(c) in settings
                and (name_of(c), c.point["variant"], c.config.seed) not in skip)

    e_res = {c.cell_id: CellResult(c, cell_rounds(score(c), score(c) - 1)
                                   if ran(c, earlier_ran, earlier_skip) else [])
             for c in earlier.cells()}
    res = {}
    for c in preset.cells():
        rounds = cell_rounds(score(c), score(c) - 1) if ran(c, mine_ran, mine_skip) else []
        if rounds and c.point["variant"] == "fedowen-random":
            rounds[50] = {**rounds[50], "val_accuracy": rounds[50]["val_accuracy"]
                          + mine_round_50 / 100}
        res[c.cell_id] = CellResult(c, rounds)
    found = [merge(d, group(preset, res).get(d.name, {}), preset.num_supernodes)
             for d in collect(group(earlier, e_res), group(dev, dev_res), 100)]
    return preset, res, found


ALL = {"femnist", "mnist 0.01", "mnist 0.1", "fashion 0.01", "fashion 0.1",
       "cifar10 0.1"}


def test_the_adopted_default_is_selection_peers_devs_while_this_grid_is_partial(
        tmp_path: Path) -> None:
    from studies.selection.peers_code import write

    # Prepare: selection-peers-dev complete in all six settings; this grid in all but CIFAR-10.
    # By score(): every contender below fedowen-random (74) in every setting, so none is
    # eligible there and the fallback (fewest failing settings: 6 each; then the higher mean)
    # adopts delta-phi (69, above hics-phi 68 and fedowen 67). The best peer of either reading
    # is hics-code-t0.03 (75) in the five settings read: delta-phi 6 points short in each
    preset, res, found = three_grids(ALL, ALL - {"cifar10 0.1"})
    # Execute
    write(preset, found, res, tmp_path, "test")
    # Assert
    data = json.loads((tmp_path / "selection-code-decisions.json").read_text())
    assert len(data["settings_read"]) == 5
    assert data["adopted"] == "delta-phi"
    assert [(name, mean) for name, mean, _ in data["adopted_short"]] == [
        (name, pytest.approx(-6.0)) for name in data["settings_read"]]
    assert data["kept"]["adopted (selection-peers-dev)"] == {"decision": "delta-phi",
                                                             "kept": 5, "of": 5}
    page = (tmp_path / "selection-code.md").read_text()
    assert "The adopted default, **delta-phi** (selection-peers-dev), falls short" in page


def test_the_per_round_files_hold_only_this_grids_cells(tmp_path: Path) -> None:
    import csv
    import gzip

    from studies.selection.peers_code import write

    # Prepare: selection-peers-dev finished FEMNIST and MNIST alpha 0.1, this grid FEMNIST
    # only, its fedowen-random 1 point off selection-peers-dev's in round 50 (final rounds
    # equal: the anchor reproduced)
    preset, res, found = three_grids({"femnist", "mnist 0.1"}, {"femnist"}, mine_round_50=1.0)
    # Execute
    names = {p.name for p in write(preset, found, res, tmp_path, "test")}
    # Assert: no file for MNIST alpha 0.1, where this grid has no cell
    assert "selection-code-mnist-alpha0.1-rounds.csv.gz" not in names
    assert "selection-code-mnist-alpha0.1-val.png" not in names
    with gzip.open(tmp_path / "selection-code-femnist-rounds.csv.gz", "rt") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["arm"] for r in rows} == {"fedowen-random", "delta-code", "hics-code-t0.03",
                                        "hics-code-t0.1"}
    assert {r["source"] for r in rows} == {"here"}
    # this grid's fedowen-random, seed 0: 60 + 14 + 1 in round 50 (selection-peers-dev's: 74)
    row = next(r for r in rows if (r["arm"], r["seed"], r["round"]) == ("fedowen-random", "0",
                                                                        "50"))
    assert row["val_accuracy"] == "75.00"


def test_missing_cells_say_which_grid_they_belong_to(tmp_path: Path) -> None:
    from studies.selection.peers_markdown import missing_section

    # Prepare: fedowen-random seed 4 on FEMNIST missing in both grids
    _, _, found = three_grids({"femnist"}, {"femnist"},
                              earlier_skip={("femnist", "fedowen-random", 4)},
                              mine_skip={("femnist", "fedowen-random", 4)})
    femnist = next(c for c in found if c.data.name == "femnist")
    # Execute
    lines = missing_section([femnist.data])
    # Assert: one label each, not one arm missing seed 4 twice
    assert sorted(femnist.data.missing) == ["fedowen-random seed=4",
                                            "selection-peers-dev fedowen-random seed=4"]
    assert lines[2] == ("- femnist: 2 missing: seeds 4 of selection-peers-dev fedowen-random, "
                        "fedowen-random")


def test_an_empty_results_folder_says_to_run_the_grid(tmp_path: Path) -> None:
    from studies.selection.peers_code_data import read_all

    # Prepare: this grid's results folder made but empty (nothing has run yet)
    (tmp_path / "results").mkdir()
    # Execute
    with pytest.raises(SystemExit) as raised:
        read_all(Path("conf/selection-peers-code.toml"), tmp_path / "results",
                 Path("conf/selection-peers-dev.toml"), tmp_path / "no-earlier",
                 Path("conf/selection-dev.toml"), tmp_path / "no-reference")
    # Assert: it names the flag the user passed and what to do, before reading anything else
    assert str(raised.value).startswith(f"--results {tmp_path / 'results'}: ")
    assert "python -m sim.experiments run conf/selection-peers-code.toml" in str(raised.value)


def test_the_anchor_csv_holds_numbers_against_selection_peers_dev(tmp_path: Path) -> None:
    import csv

    from studies.selection.peers_code import write

    # Prepare: both grids finished FEMNIST
    preset, res, found = three_grids({"femnist"}, {"femnist"})
    # Execute
    write(preset, found, res, tmp_path, "test")
    # Assert: seed 1's fedowen-random, 74.25 / 73.25 % in both grids, as fractions
    with (tmp_path / "selection-code-anchor.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["setting"] == "femnist"]
    assert rows[1]["val_here"] == rows[1]["val_selection_peers_dev"] == "0.7425"
    assert rows[1]["test_here"] == rows[1]["test_selection_peers_dev"] == "0.7325"
    assert rows[1]["same"] == "True" and rows[1]["status"] == "reproduced"


def test_a_tie_of_hics_codes_temperatures_goes_to_the_first_listed() -> None:
    # Prepare: both temperatures at 78, below the earlier best (poc-d50, 80)
    s = setting("a", {**EARLIER, "delta-code": 70, "hics-code-t0.03": 78, "hics-code-t0.1": 78,
                      "fedowen": 80, "hics-phi": 80, "delta-phi": 80})
    # Execute
    reading = read_code([s], {"a": "poc-d50"}, total=1)
    # Assert
    assert reading.tuned["a"]["hics-code"] == "hics-code-t0.03"
    assert reading.best["a"] == "poc-d50"


def test_leave_one_seed_out_rereads_selection_peers_devs_own_settings() -> None:
    # Prepare: a read by both grids, e by selection-peers-dev only. Every contender but
    # delta-phi level with or above fedowen-random (70) and the best peer (poc-d50, 75), so
    # the mean val over a and e adopts: fedowen (81 in a; in e 90 at seed 0, 80 after: 82)
    # averages 81.5 against hics-phi's 81, and 80.5 without seed 0
    base = {**EARLIER, "poc-d50": 75.0, "delta-phi": 70.0}
    code = {"delta-code": 60.0, "hics-code-t0.03": 60.0, "hics-code-t0.1": 60.0}
    a = setting("a", {**base, **code, "fedowen": 81, "hics-phi": 81}, spread=0.0)
    e = by_seed("e", {**{arm: [v] * 5 for arm, v in base.items()},
                      "fedowen": [90, 80, 80, 80, 80], "hics-phi": [81] * 5})
    reference = {"a": "poc-d50", "e": "poc-d50"}
    # Execute
    full = read_code([a], reference, total=2, earlier_found=[a, e])
    counts = kept_code(full, leave_one_out_code([a], reference, range(5), total=2,
                                                earlier_found=[a, e]))
    # Assert: adopted on both settings though this grid reads one; seed 0 left out flips it
    assert list(full.best) == ["a"] and full.adopted == "fedowen"
    assert counts["adopted (selection-peers-dev)"] == ("fedowen", 4)


def stalling(cell_id: str, accepted_until: int, recorded: int, total: int = 10) -> CellResult:
    """A cell of ``total`` rounds that recorded rounds 0-``recorded``, accepting updates up to
    round ``accepted_until`` and none after (two replies rejected for two reasons a round);
    val 50% + 1 point a round, test 1 point below."""
    from sim.grid import Cell

    def record(r: int) -> dict[str, object]:
        took = r <= accepted_until
        return {"round": r, "val_accuracy": (50 + r) / 100, "test_accuracy": (49 + r) / 100,
                "returned": ["1"] if took else [],
                "rejected": {} if took else {"2": "non-finite", "3": "norm ratio"}}
    return CellResult(Cell(cell_id, "g", {"num-server-rounds": total}),
                      [{"round": 0, "val_accuracy": 0.1, "test_accuracy": 0.1}]
                      + [record(r) for r in range(1, recorded + 1)])


def test_a_cell_the_app_stopped_is_scored_at_the_model_it_stopped_with() -> None:
    from studies.selection.cells import cell_scores
    from studies.selection.peers_code_data import carried

    # Prepare: stopped after rounds 5-7 accepted nothing (max-stalled-rounds 3, the default);
    # still running after two such rounds; finished
    stopped = stalling("s", accepted_until=4, recorded=7)
    running = stalling("r", accepted_until=4, recorded=6)
    done = stalling("d", accepted_until=10, recorded=10)
    # Execute
    scored_stop = carried(stopped)
    # Assert: rounds 8-10 carry round 7's accuracies (57 / 56); the score, rounds 6-10, is
    # (56 + 57 x 4) / 5 = 56.8; the others untouched
    assert scored_stop.finished and [r["round"] for r in scored_stop.rounds][-4:] == [7, 8, 9, 10]
    assert all(r["carried"] for r in scored_stop.rounds[-3:])
    assert cell_scores(scored_stop)["val_accuracy"] == pytest.approx(56.8)
    assert carried(running) is running and carried(done) is done


def test_an_anchor_run_at_the_earlier_grids_commits_is_a_copy() -> None:
    from studies.selection.peers_code_data import copied
    from studies.selection.peers_data import anchor_check

    # Prepare: seed 0 equal in both grids, its cell here at selection-peers-dev's commit
    here = {0: stalling("a", 10, 10)}
    there = {0: stalling("a", 10, 10)}
    same = ({"a": ["c214fce0"]}, {"a": ["c214fce0"]})
    rerun = ({"a": ["a455225f"]}, {"a": ["c214fce0"]})
    # Execute / Assert
    assert copied(anchor_check(here, there, (0,), same)).status == "copied"
    assert not copied(anchor_check(here, there, (0,), same)).holds
    assert copied(anchor_check(here, there, (0,), rerun)).status == "reproduced"
