"""selection-peers-dev's rule and report (studies.selection.peers*) on hand-built scores and
records: peer tuning, the best peer, eligibility, the fallback, leave one seed out, the anchor
check, a partial grid."""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sim.grid import Cell
from sim.results import CellResult
from studies.selection.cells import VAL, round_cost, round_costs
from studies.selection.development import Setting
from studies.selection.peers_data import anchor_check
from studies.selection.peers_rule import kept, leave_one_out, read

PEERS_LOW = {"greedyfed-mean": 60.0, "greedyfed-m0.9": 60.0, "delta-s1": 60.0,
             "delta-s0": 60.0, "hics-t0.03": 60.0, "hics-t0.1": 60.0}


def setting(name: str, means: dict[str, float], spread: float = 0.5) -> Setting:
    """Five seeds per arm: ``mean + spread * (-2, -1, 0, 1, 2)``, the same pattern for every
    arm, so paired differences are exact (half-width 0)."""
    return by_seed(name, {arm: [m + spread * (s - 2) for s in range(5)]
                          for arm, m in means.items()})


def by_seed(name: str, values: dict[str, list[float]]) -> Setting:
    """An arm's val per seed 0, 1, ... as given."""
    return Setting(name, {arm: {VAL: dict(enumerate(v))} for arm, v in values.items()},
                   {arm: dict.fromkeys(range(len(v)), 1.0) for arm, v in values.items()})


def settings_ab(fedowen_a: float = 85) -> tuple[Setting, Setting]:
    """Two settings: in a, the reference (poc-d50, 83) above every tuned new peer and fedowen
    at ``fedowen_a``; in b, DELTA's diversity-only arm (72) above the reference (71.5),
    hics-phi 1 below it, delta-phi level with it."""
    a = setting("a", {"greedyfed-mean": 80, "greedyfed-m0.9": 81, "delta-s1": 79,
                      "delta-s0": 78, "hics-t0.03": 77, "hics-t0.1": 82, "poc-d50": 83,
                      "fedowen-random": 80, "fedowen": fedowen_a, "hics-phi": 84,
                      "delta-phi": 83})
    b = setting("b", {"greedyfed-mean": 70, "greedyfed-m0.9": 69, "delta-s1": 71,
                      "delta-s0": 72, "hics-t0.03": 68, "hics-t0.1": 67, "oort-x0.1": 71.5,
                      "fedowen-random": 70, "fedowen": 72.5, "hics-phi": 71, "delta-phi": 72})
    return a, b


def test_the_rule_tunes_the_peers_picks_the_best_and_adopts_the_best_eligible() -> None:
    # Prepare: in a, the reference (poc-d50, 83) above every tuned new peer; in b, DELTA's
    # diversity-only arm (72) above the reference (71.5); hics-phi 1 below it in b, delta-phi
    # level with it (upper bound exactly 0: not below)
    a, b = settings_ab()
    reference = {"a": "poc-d50", "b": "oort-x0.1"}
    # Execute
    reading = read([a, b], reference, total=2)
    # Assert: the knobs of the higher mean; the best peer; hand-read failures and means
    assert reading.tuned["a"] == {"greedyfed": "greedyfed-m0.9", "delta": "delta-s1",
                                  "hics-fl": "hics-t0.1"}
    assert reading.tuned["b"] == {"greedyfed": "greedyfed-mean", "delta": "delta-s0",
                                  "hics-fl": "hics-t0.03"}
    assert reading.best == {"a": "poc-d50", "b": "delta-s0"}
    assert [f.text() for f in reading.failures["hics-phi"]] == ["b: -1.00 ± 0.00 vs delta-s0"]
    assert reading.eligible("fedowen") and reading.eligible("delta-phi")
    assert reading.means == pytest.approx({"fedowen": 78.75, "hics-phi": 77.5,
                                           "delta-phi": 77.5})
    assert reading.adopted == "fedowen" and not reading.fallback
    # nothing is adopted before every setting is read
    assert read([a, b], reference, total=3).adopted is None


def test_the_fallback_counts_failing_settings_then_the_higher_mean() -> None:
    # Prepare: random 70, best peer 72 (greedyfed's memory 0.9) everywhere. Algorithm 2 fails
    # one setting twice (below both), hics-phi two settings once each (below the best peer):
    # equal failures, but Algorithm 2 fails fewer settings
    base = {**PEERS_LOW, "greedyfed-m0.9": 72, "poc-d20": 60, "fedowen-random": 70}
    a = setting("a", {**base, "fedowen": 69, "hics-phi": 71, "delta-phi": 65})
    b = setting("b", {**base, "fedowen": 75, "hics-phi": 71, "delta-phi": 65})
    c = setting("c", {**base, "fedowen": 75, "hics-phi": 80, "delta-phi": 65})
    reference = dict.fromkeys("abc", "poc-d20")
    # Execute
    reading = read([a, b, c], reference, total=3)
    # Assert
    assert len(reading.failures["fedowen"]) == len(reading.failures["hics-phi"]) == 2
    assert reading.failing("fedowen") == ["a"] and reading.failing("hics-phi") == ["a", "b"]
    assert reading.means["hics-phi"] > reading.means["fedowen"]
    assert reading.adopted == "fedowen" and reading.fallback
    # Algorithm 2 also just below the best peer in b: two settings each, the higher mean wins
    b2 = setting("b", {**base, "fedowen": 71, "hics-phi": 71, "delta-phi": 65})
    reading = read([a, b2, c], reference, total=3)
    assert reading.failing("fedowen") == ["a", "b"] and reading.adopted == "hics-phi"


def test_leave_one_seed_out_counts_the_readings_that_keep_each_decision() -> None:
    # Prepare: GreedyFed's running mean ahead only through seed 0 (82 vs 81; 80 vs 81
    # without it); Algorithm 2's differences to random (4, -1, -1, -1, -1): mean 0, upper
    # bound 2.78; without seed 0 all -1 (below); without another seed mean 0.25, bound 4.23
    s = by_seed("femnist", {
        **{arm: [v] * 5 for arm, v in PEERS_LOW.items()},
        "greedyfed-mean": [70, 60, 60, 60, 60], "greedyfed-m0.9": [61] * 5,
        "delta-s1": [65] * 5, "poc-d20": [50] * 5, "fedowen-random": [80] * 5,
        "fedowen": [84, 79, 79, 79, 79], "hics-phi": [90] * 5, "delta-phi": [70] * 5})
    reference = {"femnist": "poc-d20"}
    # Execute
    full = read([s], reference, total=1)
    loo = leave_one_out([s], reference, range(5), total=1)
    counts = kept(full, loo)
    # Assert: seed 0 left out flips the tuning and Algorithm 2's pass; the rest hold
    assert [r.tuned["femnist"]["greedyfed"] for r in loo] == ["greedyfed-m0.9"] + [
        "greedyfed-mean"] * 4
    assert counts["femnist: greedyfed tuned"] == ("greedyfed-mean", 4)
    assert counts["femnist: best peer"] == ("delta-s1", 5)
    assert counts["femnist: fedowen"] == ("passes", 4)
    assert counts["femnist: delta-phi"] == ("fails", 5)
    assert counts["fedowen eligible"] == ("yes", 4)
    assert counts["adopted"] == ("hics-phi", 5)


def result(cell_id: str, val: float, test: float, rounds: int = 2, done: int | None = None
           ) -> CellResult:
    """A cell of ``rounds`` rounds that recorded ``done`` of them (all by default), each at
    ``val`` / ``test`` (fractions)."""
    cell = Cell(cell_id, "g", {"num-server-rounds": rounds})
    last = rounds if done is None else done
    return CellResult(cell, [{"round": r, VAL: val, "test_accuracy": test}
                             for r in range(last + 1)])


def test_the_anchor_holds_only_when_every_seed_reproduces_exactly() -> None:
    # Prepare: selection-dev's three seeds; here the same, one differing in the 12th decimal
    # of its test accuracy, or one unfinished
    there = {s: result(f"c{s}", 0.8 + s / 100, 0.81 + s / 100) for s in range(3)}
    same = {s: result(f"c{s}", 0.8 + s / 100, 0.81 + s / 100) for s in range(3)}
    off = {**same, 1: result("c1", 0.81, 0.82 + 1e-12)}
    unfinished = {**same, 2: result("c2", 0.82, 0.83, done=1)}
    commits = ({"c0": ["abcdef0123"]}, {"c0": ["9876543210", "0123456789"]})
    # Execute
    checks = [anchor_check(here, there, (0, 1, 2), commits)
              for here in (same, off, unfinished, {**off, 2: unfinished[2]})]
    # Assert
    assert [c.status for c in checks] == ["reproduced", "differs", "pending", "differs"]
    assert [r["same"] for r in checks[1].seeds] == [True, False, True]
    assert [r["same"] for r in checks[2].seeds] == [True, True, None]
    assert checks[0].holds and not checks[1].holds and not checks[2].holds
    assert checks[0].seeds[0]["commits_here"] == "abcdef0"
    assert checks[0].seeds[0]["commits_there"] == "9876543 0123456"


def test_round_costs_read_each_selectors_record() -> None:
    # Prepare: GreedyFed's two timings, Power-of-Choice's queries, HiCS-FL's own fields, and
    # a record with no selection field
    records = [{"round": 0},
               {"round": 1, "n_evals": 30, "valuation_seconds": 2.0, "round_seconds": 3.0,
                "selection": {"choose_seconds": 0.25, "observe_seconds": 0.5}},
               {"round": 2, "n_evals": 10, "valuation_seconds": 1.0, "round_seconds": 2.0,
                "selection": {"query_messages": 20}},
               {"round": 3, "round_seconds": 1.0,
                "selection": {"server_seconds": 0.125, "extra_messages": 0}}]
    # Execute
    costs = [round_cost(r) for r in records[1:]]
    mean = round_costs(CellResult(None, records))  # type: ignore[arg-type]
    # Assert: each round as recorded; the means over the rounds that carry each
    assert costs[0]["selector_seconds"] == 0.75 and costs[0]["extra_messages"] is None
    assert costs[1]["extra_messages"] == 20.0 and costs[1]["selector_seconds"] is None
    assert costs[2] == {"n_evals": None, "valuation_seconds": None, "selector_seconds": 0.125,
                        "extra_messages": 0.0, "round_seconds": 1.0}
    assert mean == {"n_evals": 20.0, "valuation_seconds": 1.5, "selector_seconds": 0.4375,
                    "extra_messages": 10.0, "round_seconds": 2.0}
    assert round_costs(CellResult(None, records[:1]))["n_evals"] is None  # type: ignore[arg-type]
    # Assert: today's record, which the shared selection writes for every selector, comes first
    today = round_cost({"round": 4, "selection": {"selector_seconds": 0.5, "extra_messages": 3,
                                                  "server_seconds": 9.0}})
    assert (today["selector_seconds"], today["extra_messages"]) == (0.5, 3.0)


def test_reference_records_read_alike_from_an_archive_and_a_results_folder(tmp_path: Path
                                                                          ) -> None:
    from sim.presets import load_preset
    from studies.selection.peers_data import reference_results

    # Prepare: one selection-dev cell's records, in a tar.gz and in a results folder
    dev = load_preset(Path("conf/selection-dev.toml"))
    cid = dev.cells()[0].cell_id
    files = {"rounds.jsonl": "\n".join(json.dumps({"round": r, VAL: 0.5}) for r in range(3)),
             "code.json": json.dumps([{"commit": "1234567890"}, {"commit": "1234567890"}])}
    with tarfile.open(tmp_path / "cells.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"{cid}/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    for name, text in files.items():
        (tmp_path / "results" / cid).mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / cid / name).write_text(text)
    # Execute
    packed, packed_commits = reference_results(dev, tmp_path / "cells.tar.gz")
    folder, folder_commits = reference_results(dev, tmp_path / "results")
    # Assert: the same rounds and commits; every other cell empty
    assert packed[cid].rounds == folder[cid].rounds == [{"round": r, VAL: 0.5} for r in range(3)]
    assert packed_commits == folder_commits == {cid: ["1234567890"]}
    assert len(packed) == len(dev.cells()) and sum(bool(r.rounds) for r in packed.values()) == 1


def cell_rounds(val: float, test: float, rounds: int = 100) -> list[dict[str, Any]]:
    """A finished run at ``val`` / ``test`` (%) in every round, client r % 100 selected."""
    return [{"round": 0, VAL: 0.1, "test_accuracy": 0.1}] + [
        {"round": r, VAL: val / 100, "test_accuracy": test / 100, "selected": [r % 100],
         "n_evals": 4, "round_seconds": 1.0} for r in range(1, rounds + 1)]


def score(cell: Cell) -> float:
    """A hand-set val (%) by arm and seed: longer names higher, oort-x0.1 half a point up
    (selection-dev's tuning picks it on FEMNIST), a quarter point a seed."""
    bonus = 0.5 if cell.point["variant"] == "oort-x0.1" else 0.0
    return 60.0 + len(cell.point["variant"]) + bonus + cell.config.seed / 4


def test_a_partial_grid_reads_only_its_complete_settings(tmp_path: Path) -> None:
    from sim.presets import load_preset
    from studies.selection.peers_data import collect, group
    from studies.selection.peers_report import write

    # Prepare: selection-dev complete; here FEMNIST complete with its anchor reproduced, MNIST
    # alpha 0.01 without hics-phi seed 4, MNIST alpha 0.1 complete with seed 2 of its anchor
    # 0.01 points off, nothing else
    preset = load_preset(Path("conf/selection-peers-dev.toml"))
    dev = load_preset(Path("conf/selection-dev.toml"))

    dev_res = {c.cell_id: CellResult(c, cell_rounds(score(c), score(c) - 1)) for c in dev.cells()}
    res = {}
    for c in preset.cells():
        name = c.grid + ("" if c.grid == "femnist" else f" {c.config.alpha:g}")
        off = 0.01 if (name, c.point["variant"], c.config.seed) == (
            "mnist 0.1", "fedowen-random", 2) else 0.0
        skip = name not in ("femnist", "mnist 0.01", "mnist 0.1") or (
            name, c.point["variant"], c.config.seed) == ("mnist 0.01", "hics-phi", 4)
        res[c.cell_id] = CellResult(c, [] if skip else cell_rounds(score(c) + off, score(c) - 1))
    # Execute
    found = collect(group(preset, res), group(dev, dev_res), preset.num_supernodes)
    paths = write(preset, found, res, tmp_path, "python -m studies.selection.peers test")
    # Assert: FEMNIST read, with selection-dev's three arms; the others not
    by_name = {d.name: d for d in found}
    assert [d.name for d in found if d.decided] == ["femnist"]
    assert list(by_name["femnist"].sources)[-3:] == ["fedowen", "fedavg-equal", "oort-x0.1"]
    assert by_name["mnist alpha=0.01"].missing == ["hics-phi seed=4"]
    assert by_name["mnist alpha=0.01"].anchor.status == "reproduced"
    assert by_name["mnist alpha=0.1"].anchor.status == "differs"
    assert set(by_name["mnist alpha=0.1"].sources.values()) == {"here"}
    assert by_name["cifar10 alpha=0.1"].anchor.status == "pending"
    readme = (tmp_path / "selection.md").read_text()
    assert "(partial: 134 of 270 cells finished)" in readme
    assert "- mnist alpha=0.01: 1 missing: seeds 4 of hics-phi" in readme
    assert "- cifar10 alpha=0.1: 45 missing: all seeds of every arm here" in readme
    assert "Not read yet: 1 cell(s) missing." in readme and "The anchor **differs**" in readme
    assert "No default adopted: the rule waits for all 6 settings." in readme
    assert "| femnist: best peer |" in readme
    names = {p.name for p in paths}
    assert {"selection-femnist-rounds.csv.gz", "selection-mnist-alpha0.1-val.png"} <= names
    assert "selection-cifar10-alpha0.1-val.png" not in names
    arms = (tmp_path / "selection-arms.csv").read_text().splitlines()
    assert arms[0].startswith("setting,arm,source,n,best_peer,val,val_half")
    assert not any(math.isnan(float(x)) for x in arms[1].split(",")[5:7])
    # the decisions as data: FEMNIST alone read, nothing adopted, its best peer as in the page
    data = json.loads((tmp_path / "selection-decisions.json").read_text())
    assert data["settings_read"] == ["femnist"] and data["settings_total"] == 6
    assert data["adopted"] is None and data["fallback"] is False
    femnist = data["settings"]["femnist"]
    assert f"| femnist: best peer | {femnist['best_peer']} |" in readme
    assert femnist["best_peer_from"] == by_name["femnist"].sources[femnist["best_peer"]]
    assert set(femnist["contenders"]) == {"fedowen", "hics-phi", "delta-phi"}
    assert data["kept"]["femnist: best peer"]["of"] == 5


def test_an_arm_row_shows_each_difference_over_the_seeds_it_pairs() -> None:
    from studies.selection.peers_markdown import arm_table

    # Prepare: an arm of 5 seeds paired with one seed of random so far, no best peer yet
    row: dict[str, Any] = {"arm": "fedowen", "source": "selection-dev", "n": 5, "val": 79.0,
                           "val_half": 0.7, "test": 79.5, "test_half": 0.6, "distinct": 1.0,
                           "n_evals": 33.8, "valuation_seconds": 0.76, "selector_seconds": None,
                           "extra_messages": None, "round_seconds": 1.29}
    for metric in ("val", "test"):
        row.update({f"{metric}_vs_random": -0.64, f"{metric}_vs_random_half": math.nan,
                    f"{metric}_vs_random_n": 1, f"{metric}_vs_peer": math.nan,
                    f"{metric}_vs_peer_half": math.nan, f"{metric}_vs_peer_n": 0})
    # Execute
    line = arm_table([row])[2]
    # Assert
    assert line == ("| fedowen | selection-dev | 5 | 79.00 ± 0.70 | 79.50 ± 0.60 | -0.64 (n=1) | "
                    "-0.64 (n=1) | - | - | 1.00 | 33.8 | 0.760 | - | - | 1.29 |")


def test_deviation_1_sets_aside_the_step_scale_arms_cells_run_before_the_fix() -> None:
    from sim.presets import load_preset
    from studies.selection.peers_data import set_aside

    # Prepare: seed 0 of FEMNIST; hics-phi and delta-s0 once at c975d47, hics-phi's rerun at
    # the fix's pin, greedyfed-mean at c975d47 (it never asks for step-scale)
    preset = load_preset(Path("conf/selection-peers-dev.toml"))
    cells = {c.point["variant"]: c for c in preset.cells()
             if c.grid == "femnist" and c.config.seed == 0}
    res = {c.cell_id: CellResult(c, cell_rounds(70.0, 69.0)) for c in cells.values()}
    old, new = "c975d477c85d7b1f9bcb26f15fb872592b45ebd8", "c214fce0000000000000000000000000000000"
    commits = {cells["hics-phi"].cell_id: [old, new], cells["delta-s0"].cell_id: [old],
               cells["hics-t0.1"].cell_id: [new], cells["greedyfed-mean"].cell_id: [old]}
    # Execute
    out, aside = set_aside(res, commits)
    # Assert: any attempt before the fix sets a step-scale arm's cell aside, read as missing
    assert sorted(aside) == sorted([cells["hics-phi"].cell_id, cells["delta-s0"].cell_id])
    assert all(not out[cid].finished for cid in aside)
    assert out[cells["hics-t0.1"].cell_id].finished
    assert out[cells["greedyfed-mean"].cell_id].finished


def test_a_differing_anchor_reads_the_reference_arms_run_again_here() -> None:
    from sim.presets import load_preset
    from studies.selection.peers_data import collect, group

    # Prepare: FEMNIST complete in both grids, this grid's fedowen-random 0.01 off in seed 2;
    # fedowen, fedavg-equal and the tuned Oort arm run again here 5 points up; selection-dev's
    # tuning favours oort-x0.1 (its records), whose PoC and other Oort arms do not run here
    preset = load_preset(Path("conf/selection-peers-dev.toml"))
    dev = load_preset(Path("conf/selection-dev.toml"))

    dev_res = {c.cell_id: CellResult(c, cell_rounds(score(c), score(c) - 1)) for c in dev.cells()}
    res = {}
    for c in preset.cells():
        off = 0.01 if (c.point["variant"], c.config.seed) == ("fedowen-random", 2) else 0.0
        res[c.cell_id] = CellResult(c, cell_rounds(score(c) + off, score(c) - 1)
                                    if c.grid == "femnist" else [])
    local = group(preset, res)
    for arm in ("fedowen", "fedavg-equal", "oort-x0.1"):  # run again here
        for seed, r in group(dev, dev_res)["femnist"][arm].items():
            local["femnist"][arm] = {**local["femnist"].get(arm, {}),
                                     seed: CellResult(r.cell, cell_rounds(score(r.cell) + 5, 0))}
    # Execute
    (femnist,) = [d for d in collect(local, group(dev, dev_res), 100) if d.name == "femnist"]
    # Assert: read, every arm from here, the reference chosen as tuned in selection-dev
    assert femnist.decided and femnist.anchor.status == "not needed"
    assert femnist.reference_peer == "oort-x0.1"
    assert set(femnist.sources.values()) == {"here"}
    assert femnist.setting.mean("oort-x0.1") == pytest.approx(60 + 9 + 0.5 + 1.0 / 2 + 5)


def test_a_finished_cell_without_a_finite_val_counts_as_missing() -> None:
    from studies.selection.peers_data import scored

    cell = Cell("x", "femnist", {}, {"variant": "hics-phi"})
    nan = cell_rounds(70.0, 69.0)
    for r in nan[-5:]:
        r[VAL] = math.nan
    assert scored(CellResult(cell, cell_rounds(70.0, 69.0)))
    assert not scored(CellResult(cell, nan))
    assert not scored(CellResult(cell, [])) and not scored(None)


def test_the_peers_table_shows_where_the_adopted_default_falls_short() -> None:
    from types import SimpleNamespace

    from studies.selection.peers_markdown import peers_reached

    # Prepare: the two settings of the first test, fedowen 1 below the best peer in a: it
    # fails there, hics-phi fails b, delta-phi (level with both best peers) is adopted
    a, b = settings_ab(fedowen_a=82)
    reading = read([a, b], {"a": "poc-d50", "b": "oort-x0.1"}, total=2)
    found = [SimpleNamespace(name=s.name, setting=s) for s in (a, b)]
    # Execute
    lines = peers_reached(found, reading)  # type: ignore[arg-type]
    partial = peers_reached(found[:1], read([a], {"a": "poc-d50"}, total=2))  # type: ignore[arg-type]
    # Assert: each peer tuned, the best peer, the default against random and the best peer
    assert reading.adopted == "delta-phi"
    assert lines[2] == ("| setting | greedyfed | delta | hics-fl | best peer | delta-phi "
                        "(adopted) | - random | - best peer |")
    assert lines[4] == ("| a | greedyfed-m0.9 81.00 (+1.00 ± 0.00) | delta-s1 79.00 (-1.00 ± "
                        "0.00) | hics-t0.1 82.00 (+2.00 ± 0.00) | poc-d50 83.00 | 83.00 | "
                        "+3.00 ± 0.00 | +0.00 ± 0.00 |")
    assert lines[5].endswith("| delta-s0 72.00 | 72.00 | +2.00 ± 0.00 | +0.00 ± 0.00 |")
    # before a default is adopted, only the peers
    assert partial[2] == "| setting | greedyfed | delta | hics-fl | best peer |"
