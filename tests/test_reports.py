"""The experiments' reports (synthetic rounds.jsonl), the adversarial statistics and the report
archives that restore finished cells. No Ray here."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from fedowen_task.adversary.keys import adversary_ids
from sim.presets import parse_preset
from sim.report import write_report
from sim.results import Stat
from studies.adversarial.adversary_stats import (
    ledger_stats,
    moving_average,
    rank_percentiles,
    round_stats,
)
from tests.fake_runner import FakeFlwr, make_runner, small_preset, write_rounds

# ---------------------------------------------------------------- reports

def test_stat_text() -> None:
    assert Stat((80.0, 82.0), 2).text() == "81.00 ± 1.41"
    assert Stat((80.0,), 3).text() == "80.00 ± - (n=1/3)"
    assert Stat((), 3).text() == "-"


def test_report_from_synthetic_rounds(tmp_path: Path) -> None:
    # Prepare: final accuracies owen 0.80/0.82, none 0.70/0.74 at alpha 0.01; at alpha 0.1
    # none wins (0.95 vs 0.90)
    raw = small_preset(rows="valuation", paper=[
        {"where": {"dataset": "mnist", "alpha": 0.01}, "values": {"owen": 84.77, "none": 77.6}}])
    preset = parse_preset(raw)
    finals = {(0.01, "owen"): [0.80, 0.82], (0.01, "none"): [0.70, 0.74],
              (0.1, "owen"): [0.90, 0.90], (0.1, "none"): [0.95, 0.95]}
    for cell in preset.cells():
        cfg = cell.run_config
        final = finals[(cfg["alpha"], cfg["valuation"])][cfg["seed"]]
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, final])
    # Execute
    files = write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert
    md = (tmp_path / "out" / "README.md").read_text()
    assert "| owen | **81.00 ± 1.41** | 90.00 ± 0.00 |" in md
    assert "| none | 72.00 ± 2.83 | **95.00 ± 0.00** |" in md
    assert "81.00 / 84.77 / -3.77" in md
    assert "alpha=0.1: owen ranks 2 of 2 (90.00); better: none (95.00)." in md
    assert all(f.exists() for f in files)
    assert {f.suffix for f in files} == {".md", ".csv", ".png"}
    csv_text = (tmp_path / "out" / "final_accuracy.csv").read_text()
    assert "t,final,valuation,owen,alpha=0.01,2,2,81.0,1.4142,80.00 82.00,84.77" in csv_text


def test_report_counts_unfinished_cells_out_of_the_table(tmp_path: Path) -> None:
    # Prepare: one seed of owen stopped after round 2 of 3
    preset = parse_preset(small_preset(axes={"seed": [0, 1], "valuation": ["owen"]}))
    c0, c1 = preset.cells()
    write_rounds(tmp_path / "res" / c0.cell_id, [0.1, 0.5, 0.6, 0.8])
    write_rounds(tmp_path / "res" / c1.cell_id, [0.1, 0.5, 0.6])
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert
    md = (tmp_path / "out" / "README.md").read_text()
    assert "Cells finished: 1 of 2" in md
    assert "80.00 ± - (n=1/2)" in md


def test_rank_percentiles_by_hand() -> None:
    # 4 clients: a highest (0), b and c tied ((1 + 0.5) / 3 = 0.5), d lowest (1)
    ranks = rank_percentiles({"a": 3.0, "b": 1.0, "c": 1.0, "d": -2.0})
    assert ranks == {"a": 0.0, "b": 0.5, "c": 0.5, "d": 1.0}
    assert rank_percentiles({"a": 1.0}) == {"a": 0.5}


def test_round_stats_by_hand() -> None:
    # Prepare: 1 adversary of 4 participants, ranked last, with 10% of the weight
    rec = {"returned": ["1", "2", "3", "9"], "phi": {"1": 3.0, "2": 2.0, "3": 1.0, "9": -1.0},
           "weights": {"1": 0.4, "2": 0.3, "3": 0.2, "9": 0.1}}
    # Execute
    st = round_stats(rec, frozenset({"9", "50"}))
    # Assert
    assert st["share"] == 0.25 and math.isclose(st["weight_share"], 0.1)
    assert st["adv_rank"] == 1.0 and math.isclose(st["honest_rank"], 1 / 3)
    assert st["adv_phi"] == -1.0 and math.isclose(st["honest_phi"], 2.0)


def test_moving_average_ignores_nan_and_shrinks_at_edges() -> None:
    import numpy as np

    out = moving_average(np.array([0.0, 1.0, np.nan, 1.0]), 3)
    assert np.allclose(out, [0.5, 0.5, 1.0, 1.0])


def test_adversarial_report(tmp_path: Path) -> None:
    # Prepare: FedOwen never picks adversaries after round 1; FedAvg picks at the base rate
    raw = {"preset": {"name": "adv", "num-supernodes": 10},
           "base": {"dataset": "mnist", "num-server-rounds": 4, "adversary-fraction": 0.2},
           "grid": [{"name": "a", "kind": "adversarial",
                     "axes": {"seed": [0], "valuation": ["owen", "none"]}}]}
    preset = parse_preset(raw)
    adv = sorted(str(i) for i in adversary_ids(10, 0.2, 0))
    honest = [str(i) for i in range(10) if str(i) not in adv]
    for cell in preset.cells():
        out = tmp_path / "res" / cell.cell_id
        owen = cell.run_config["valuation"] == "owen"
        picked = honest[:5] if owen else [*adv[:1], *honest[:4]]
        phi = {c: (-1.0 if c in adv else 1.0) for c in picked} if owen else {}
        write_rounds(out, [0.1, 0.5, 0.6, 0.7, 0.8], {"returned": picked, "phi": phi})
    # Execute
    files = write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert
    md = (tmp_path / "out" / "README.md").read_text()
    assert "| owen | label-flip | 0.2 | 0.20 | 0.000 / 0.000 |" in md
    assert "| none | label-flip | 0.2 | 0.20 | 0.200 / 0.200 |" in md
    assert (tmp_path / "out" / "selection-share.png") in files


def test_ledger_stats_by_hand_with_a_forfeited_sybil() -> None:
    # Prepare: 10 partitions, adversaries from seed 0; two adversaries return copies in
    # round 1 (recorded duplicates) and earn +1 a round; honest clients earn +0.5, one -0.5
    from sim.grid import Cell
    from sim.results import CellResult

    adv = sorted(str(i) for i in adversary_ids(10, 0.2, 0))
    honest = [str(i) for i in range(10) if str(i) not in adv]
    phi = {**{c: 1.0 for c in adv}, **{c: 0.5 for c in honest[:3]}, honest[3]: -0.5}
    rounds = [{"round": 0}] + [{"round": r, "selected": list(phi), "phi": phi,
                                **({"duplicates": [adv]} if r == 1 else {})} for r in (1, 2)]
    cell = Cell("x", "g", {"seed": 0, "adversary-fraction": 0.2}, {"seed": 0})
    # Execute
    stats = ledger_stats(CellResult(cell, rounds), 10)
    # Assert: the adversaries are paid on min(2, 0) = 0: ranked below the three honest +1s,
    # above the honest -1 (rank percentiles over 6 clients: 3/5 for the tied Sybils)
    assert stats["ledger_adv_paid"] == 0.0
    assert stats["ledger_honest_paid"] == pytest.approx((3 * 1.0 - 1.0) / 4)
    assert stats["ledger_adv_rank"] == pytest.approx(3 / 5)
    assert stats["ledger_honest_rank"] == pytest.approx((0 + 0 + 0 + 1) / 4)
    assert stats["ledger_adv_pool"] == 0.0 and stats["ledger_adv_forfeited"] == 2.0
    assert stats["ledger_payout_ratio"] == 0.0  # honest mean share: (3 x 1/3 + 0) / 4 > 0
    assert stats["ledger_honest_forfeited"] == 0.0


# ---------------------------------------------------------------- archives

def test_archive_restores_finished_cells_only_and_keeps_existing_ones(tmp_path: Path) -> None:
    # Prepare: a sweep whose second cell crashed before finishing
    from sim.experiments import archive_cells, restore_cells

    fake = FakeFlwr(["ok", "crash-after-ckpt", "crash-after-ckpt"])
    runner = make_runner(tmp_path, fake)
    runner.run()
    done, crashed = (c.cell_id for c in runner.preset.cells())
    archive = archive_cells(runner.preset, runner.results, tmp_path / "cells.tar.gz")
    fresh = tmp_path / "fresh"
    (fresh / done).mkdir(parents=True)
    (fresh / done / "summary.json").write_text('{"kept": true}')
    # Execute
    restored_into_fresh = restore_cells(archive, fresh)
    restored_into_empty = restore_cells(archive, tmp_path / "empty")
    # Assert: only the finished cell travels, an existing cell is not overwritten
    assert restored_into_fresh == 0
    assert (fresh / done / "summary.json").read_text() == '{"kept": true}'
    assert restored_into_empty == 1
    assert (tmp_path / "empty" / done / "rounds.jsonl").read_text() == \
        (runner.results / done / "rounds.jsonl").read_text()
    assert not (tmp_path / "empty" / crashed).exists()


def test_a_report_archive_is_parts_under_the_limit_with_a_manifest_that_restores_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a finished sweep and a report that kept a single archive before issue 44
    import sim.archives as archives

    runner = make_runner(tmp_path, FakeFlwr(["ok", "ok"]))
    runner.run()
    out = tmp_path / "report"
    out.mkdir()
    (out / archives.ARCHIVE).write_bytes(b"old")
    # Execute: parts just large enough for one cell
    one = max(len(archives.pack([cell]))
              for cell in archives.cell_entries(runner.preset, runner.results))
    monkeypatch.setattr(archives, "PART_LIMIT", one + 20)
    kept = archives.keep_archive(runner.preset, runner.results, out,
                                 source="conf/confirm/x.toml", folder=tmp_path / "parts")
    manifest = json.loads(kept.read_text())
    first = [p["sha256"] for p in manifest["parts"]]
    for cell in runner.results.glob("*/rounds.jsonl"):
        os.utime(cell, (1e9, 1e9))  # another day, same records
    again = json.loads(archives.keep_archive(runner.preset, runner.results, out,
                                             source="conf/confirm/x.toml",
                                             folder=tmp_path / "parts").read_text())
    restored = {how: archives.restore_cells(path, tmp_path / how) for how, path in
                (("manifest", kept), ("folder", tmp_path / "parts"), ("report", out),
                 ("old-name", out / archives.ARCHIVE))}
    # Assert: one part per cell here, each under the limit, named from the manifest with its
    # hash; every cell listed with its part; the old single archive is gone
    assert kept.name == archives.MANIFEST and not (out / archives.ARCHIVE).exists()
    assert [p["file"] for p in manifest["parts"]] == ["../parts/cells-part01.tar.xz",
                                                      "../parts/cells-part02.tar.xz"]
    assert all(0 < p["bytes"] <= one + 20 and p["cells"] == 1 for p in manifest["parts"])
    assert [(c["cell"], c["part"]) for c in manifest["cells"]] == [
        (c.cell_id, k) for k, c in enumerate(runner.preset.cells(), 1)]
    assert manifest["rebuild"].startswith("python -m sim.experiments run conf/confirm/x.toml,")
    assert [p["sha256"] for p in again["parts"]] == first  # same cells, same bytes
    assert restored == {"manifest": 2, "folder": 2, "report": 2, "old-name": 2}
    for cell in runner.preset.cells():
        assert (tmp_path / "manifest" / cell.cell_id / "rounds.jsonl").read_bytes() == \
            (runner.results / cell.cell_id / "rounds.jsonl").read_bytes()
    # and a part that changed or went missing is named, with how to rebuild the cells
    (tmp_path / "parts" / "cells-part02.tar.xz").write_bytes(b"x")
    with pytest.raises(SystemExit, match=r"cells-part02.tar.xz .* missing or differs.*rebuild"):
        archives.restore_cells(kept, tmp_path / "third")


def test_a_manifest_from_before_the_parts_restores_from_the_archive_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: issue 30's manifest, its archive in the store of one machine
    import hashlib

    from sim.archives import archive_cells, restore_cells

    runner = make_runner(tmp_path, FakeFlwr(["ok", "ok"]))
    runner.run()
    monkeypatch.setenv("FEDOWEN_ARCHIVES", str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    stored = archive_cells(runner.preset, runner.results, tmp_path / "store" / "unit-abc.tar.gz")
    manifest = tmp_path / "cells-manifest.json"
    manifest.write_text(json.dumps({
        "preset": "unit", "archive": stored.name, "bytes": stored.stat().st_size,
        "sha256": hashlib.sha256(stored.read_bytes()).hexdigest(),
        "rebuild": "python -m sim.experiments run conf/unit.toml", "cells": []}))
    # Execute
    restored = restore_cells(manifest, tmp_path / "again")
    stored.unlink()
    # Assert: restored from the store; without it, where it should be and how to rebuild
    assert restored == 2
    with pytest.raises(SystemExit, match=r"is not in .*store.*rebuild the cells"):
        restore_cells(manifest, tmp_path / "third")


def test_restore_takes_several_archives(tmp_path: Path) -> None:
    # arena2's command restores the arena's cells and the development grid's
    from sim.experiments import _restore, archive_cells, parse_args

    first, second = FakeFlwr([]), FakeFlwr([])
    one = make_runner(tmp_path / "one", first)
    two = make_runner(tmp_path / "two", second,
                      small_preset(axes={"seed": [5], "valuation": ["owen"]}))
    one.run()
    two.run()
    archives = [archive_cells(one.preset, one.results, tmp_path / "a.tar.gz"),
                archive_cells(two.preset, two.results, tmp_path / "b.tar.gz")]
    args = parse_args(["run", "p.toml", "--restore", str(archives[0]),
                       "--restore", str(archives[1])])
    assert args.restore == archives
    _restore(args, one.preset, tmp_path / "merged")
    assert len(list((tmp_path / "merged").glob("*/summary.json"))) == 3


def test_a_report_over_a_richer_one_is_refused_unless_replace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a finished sweep, its report with an archive manifest (2 cells)
    from sim.experiments import main
    from sim.report import report_refusal

    runner = make_runner(tmp_path, FakeFlwr(["ok", "ok"]))
    runner.run()
    (runner.results / "preset.json").write_text(json.dumps(small_preset(
        axes={"seed": [0], "valuation": ["owen", "none"]})))
    out = tmp_path / "report"
    assert main(["report", "--results", str(runner.results), "--out", str(out)]) == 0
    (out / "cells-manifest.json").write_text(json.dumps(
        {"cells": [{"cell": c.cell_id} for c in runner.preset.cells()]}))
    emptier = tmp_path / "emptier"
    emptier.mkdir()
    (emptier / "preset.json").write_text((runner.results / "preset.json").read_text())
    before = (out / "README.md").read_text()
    # Execute
    missing = report_refusal(runner.preset, tmp_path / "typo", out)  # a preset named
    fewer = main(["report", "--results", str(emptier), "--out", str(out)])
    fewer_err = capsys.readouterr().err
    unchanged = (out / "README.md").read_text()
    replaced = main(["report", "--results", str(emptier), "--out", str(out), "--replace"])
    # Assert: both refused, naming the folder and what to do; the report untouched until
    # --replace
    assert missing is not None and "typo not found" in missing
    assert fewer == 2 and "2 archived cells" in fewer_err and "0 finished" in fewer_err
    assert "--restore" in fewer_err and "--replace" in fewer_err
    assert unchanged == before
    assert replaced == 0 and "Cells finished: 0 of 2" in (out / "README.md").read_text()
