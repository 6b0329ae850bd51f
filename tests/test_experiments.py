"""Experiment presets, the resumable runner (flwr run faked) and the reports (synthetic
rounds.jsonl). No Ray here; the real preset runs are ``slow``."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedowen_task.adversary.keys import adversary_ids
from sim.adversarial import ledger_stats, moving_average, rank_percentiles, round_stats
from sim.grid import cell_id
from sim.presets import PresetError, load_preset, parse_preset
from sim.report import write_report
from sim.results import Stat
from sim.runner import STATE_FILE, Runner, read_state

CONF = Path(__file__).resolve().parents[1] / "conf"


def small_preset(**grid_extra: Any) -> dict[str, Any]:
    grid = {"name": "t", "axes": {"seed": [0, 1], "alpha": [0.01, 0.1],
                                  "valuation": ["owen", "none"]}, **grid_extra}
    return {"preset": {"name": "unit", "num-supernodes": 10},
            "base": {"dataset": "mnist", "num-server-rounds": 3}, "grid": [grid]}


# ---------------------------------------------------------------- grid and cell ids

def test_grid_expands_to_product_seed_first() -> None:
    # Execute
    cells = parse_preset(small_preset()).cells()
    # Assert: 2 seeds x 2 alphas x 2 methods, all seed-0 cells first, ids unique
    assert len(cells) == 8
    assert [c.run_config["seed"] for c in cells] == [0] * 4 + [1] * 4
    assert len({c.cell_id for c in cells}) == 8
    assert cells[0].run_config == {"dataset": "mnist", "num-server-rounds": 3, "seed": 0,
                                   "alpha": 0.01, "valuation": "owen"}


def test_cell_id_is_stable_and_ignores_paths_and_key_order() -> None:
    # Prepare
    cfg = {"alpha": 0.1, "valuation": "owen", "seed": 0}
    # Assert
    assert cell_id(cfg, 100) == cell_id(dict(reversed(cfg.items())), 100)
    assert cell_id(cfg, 100) == cell_id({**cfg, "output-dir": "/x", "data-dir": "/y"}, 100)
    assert cell_id(cfg, 100) != cell_id({**cfg, "seed": 1}, 100)
    assert cell_id(cfg, 100) != cell_id(cfg, 10)
    assert len(cell_id(cfg, 100)) == 12


def test_shared_cells_of_two_grids_run_once() -> None:
    # Prepare: the second grid repeats the owen cells of the first
    raw = small_preset()
    raw["grid"].append({"name": "again", "set": {"valuation": "owen"},
                        "axes": {"seed": [0, 1], "alpha": [0.01, 0.1]}})
    # Execute / Assert
    assert len(parse_preset(raw).cells()) == 8


def test_auto_selection_pins_what_auto_meant_into_the_cells_that_value_clients() -> None:
    # Prepare: a preset declaring that auto meant Algorithm 2; owen and none cells, one owen
    # cell with its selection written
    raw = small_preset()
    raw["preset"]["auto-selection"] = "adaptive"
    raw["grid"][0]["axes"] = {"seed": [0], "valuation": ["owen", "none"],
                              "selection": ["auto", "random"]}
    # Execute
    cells = parse_preset(raw).cells()
    # Assert: pinned only where auto was left and phi is computed; the id is the explicit one's
    by = {(c.point["valuation"], c.point["selection"]): c for c in cells}
    assert by["owen", "auto"].run_config["selection"] == "adaptive"
    assert by["none", "auto"].run_config["selection"] == "auto"  # auto: random, as always
    assert by["owen", "random"].run_config["selection"] == "random"
    explicit = dict(by["owen", "auto"].run_config)
    assert by["owen", "auto"].cell_id == cell_id(explicit, 10)
    assert parse_preset(raw).to_json()["preset"]["auto-selection"] == "adaptive"
    raw["preset"]["auto-selection"] = "oort"
    with pytest.raises(PresetError, match="auto-selection='oort' must be one of"):
        parse_preset(raw)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r: r.update(extra=1), "unknown key 'extra'"),
    (lambda r: r["preset"].update(supernodes=3), "unknown key 'supernodes'"),
    (lambda r: r["grid"][0].update(colour="red"), "unknown key 'colour'"),
    (lambda r: r["base"].update(alhpa=0.1), "unknown key 'alhpa'"),
    (lambda r: r["grid"][0]["axes"].update(valuation=["owne"]), "valuation='owne'"),
    (lambda r: r["grid"][0].update(kind="sweep"), "a sweep needs x"),
    (lambda r: r["base"].update({"output-dir": "/tmp/x"}), "set by the runner"),
    (lambda r: r["grid"][0].update(axes={}), "axes must map"),
])
def test_invalid_presets_fail_with_a_clear_message(mutate: Any, message: str) -> None:
    # Prepare
    raw = small_preset()
    mutate(raw)
    # Execute / Assert
    with pytest.raises(PresetError, match=message):
        parse_preset(raw)


def test_committed_presets_parse_with_the_documented_sizes() -> None:
    # Execute
    cpu = load_preset(CONF / "paper-mnist-cpu.toml")
    full = load_preset(CONF / "paper-full.toml")
    adv = load_preset(CONF / "adversarial-mnist.toml")
    # Assert: 7 methods x 2 alphas x 3 seeds; the full grid 630 + 45 + 60 + 90 distinct cells
    assert len(cpu.cells()) == 42
    assert {c.run_config["dataset"] for c in cpu.cells()} == {"mnist"}
    assert len(full.cells()) == 825
    assert full.base["num-server-rounds"] == 100
    assert len(adv.cells()) == 18
    krum = {(c.run_config["adversary-fraction"], c.run_config["krum-malicious"])
            for c in adv.cells()}
    assert krum == {(0.2, 2), (0.3, 3)}


# ---------------------------------------------------------------- runner (flwr run faked)

@dataclass
class Outcome:
    status: str

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


@dataclass
class FakeLink:
    flwr_home: Path
    name: str = "fake"


@contextmanager
def fake_link(home: Path) -> Iterator[FakeLink]:
    yield FakeLink(home)


def write_rounds(out: Path, accs: list[float], extra: dict[str, Any] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "rounds.jsonl").open("w") as fh:
        for rnd, acc in enumerate(accs):
            rec = {"round": rnd, "test_accuracy": acc}
            if rnd:
                rec.update({"valuation_seconds": 0.5, "n_evals": 40, **(extra or {})})
            fh.write(json.dumps(rec) + "\n")


class FakeFlwr:
    """Plays ``flwr_run``: per call, the next scripted behaviour (ok | fail | crash-after-ckpt)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, link: Any, cfg: dict[str, Any], **kw: Any) -> Outcome:
        self.calls.append(cfg)
        what = self.script.pop(0) if self.script else "ok"
        out = Path(cfg["output-dir"])
        rounds = cfg["num-server-rounds"]
        if what == "ok":
            write_rounds(out, [0.1 * (r + 1) for r in range(rounds + 1)])
            (out / "summary.json").write_text("{}")
            return Outcome("finished:completed")
        if what == "crash-after-ckpt":
            write_rounds(out, [0.1, 0.2])
            (out / "checkpoint.npz").write_bytes(b"x")
        kw["stream_to"].write("Traceback: boom\n")
        return Outcome("finished:failed")


def make_runner(tmp_path: Path, fake: FakeFlwr, preset: dict[str, Any] | None = None) -> Runner:
    raw = preset or small_preset(axes={"seed": [0], "valuation": ["owen", "none"]})
    return Runner(parse_preset(raw), tmp_path / "res", tmp_path / "data", run_fn=fake,
                  link_factory=fake_link, progress=lambda msg: None)


def test_done_cells_are_not_run_again(tmp_path: Path) -> None:
    # Prepare
    fake = FakeFlwr([])
    runner = make_runner(tmp_path, fake)
    # Execute
    first = runner.run()
    second = runner.run()
    # Assert
    assert first["done"] == 2 and len(fake.calls) == 2
    assert second == {"done": 2, "failed": 0, "skipped-failed": 0, "not-run": 0}
    assert len(fake.calls) == 2
    assert fake.calls[0]["output-dir"].endswith(runner.preset.cells()[0].cell_id)
    assert "resume-from" not in fake.calls[0]


def test_failed_cell_is_retried_once_then_marked_failed(tmp_path: Path) -> None:
    # Prepare: the first cell fails twice, the second succeeds
    fake = FakeFlwr(["fail", "fail", "ok"])
    runner = make_runner(tmp_path, fake)
    # Execute
    counts = runner.run()
    again = runner.run()
    # Assert
    first = runner.preset.cells()[0].cell_id
    events = read_state(runner.results)[first]
    assert counts["failed"] == 1 and counts["done"] == 1 and len(fake.calls) == 3
    assert [e["event"] for e in events] == ["error", "error", "failed"]
    assert "finished:failed" in events[-1]["error"] and "boom" in events[-1]["log_tail"]
    assert again["skipped-failed"] == 1 and len(fake.calls) == 3
    # --retry-failed runs it again
    assert runner.run(retry_failed=True)["done"] == 2


def test_crashed_cell_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    # Prepare
    fake = FakeFlwr(["crash-after-ckpt", "ok"])
    runner = make_runner(tmp_path, fake)
    # Execute
    counts = runner.run(limit=1)
    # Assert: the retry continues from the checkpoint; the other cell was not started
    assert counts == {"done": 1, "failed": 0, "skipped-failed": 0, "not-run": 1}
    assert "resume-from" not in fake.calls[0]
    assert fake.calls[1]["resume-from"] == fake.calls[1]["output-dir"]
    lines = (runner.results / STATE_FILE).read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["error", "done"]
    # each attempt recorded the code it ran: this checkout's commit
    from sim.runner import code_state

    code = json.loads((Path(fake.calls[1]["output-dir"]) / "code.json").read_text())
    assert [(a["attempt"], a["resumed"]) for a in code] == [(1, False), (2, True)]
    assert code[0]["commit"] == code_state()["commit"]
    assert code[0]["commit"] is None or len(code[0]["commit"]) == 40


def test_a_crashed_cell_of_a_strategy_without_checkpointed_state_starts_again(
        tmp_path: Path) -> None:
    # FedAvgM's server momentum is not in the checkpoint: resuming would refuse the run config
    raw = small_preset(axes={"seed": [0], "strategy": ["fedavgm"]}, rows="strategy")
    fake = FakeFlwr(["crash-after-ckpt", "ok"])
    counts = make_runner(tmp_path, fake, raw).run()
    assert counts["done"] == 1 and len(fake.calls) == 2
    assert "resume-from" not in fake.calls[1]


def test_run_selects_one_grid(tmp_path: Path) -> None:
    # Prepare
    raw = small_preset(axes={"seed": [0], "valuation": ["owen"]})
    raw["grid"].append({"name": "other", "axes": {"seed": [0], "valuation": ["none"]}})
    fake = FakeFlwr([])
    runner = make_runner(tmp_path, fake, raw)
    # Execute
    runner.run(grids=["other"])
    # Assert
    assert [c["valuation"] for c in fake.calls] == ["none"]


def test_run_keeps_the_cells_where_an_axis_has_a_value(tmp_path: Path) -> None:
    # Prepare: two alphas x two valuations
    raw = small_preset(axes={"seed": [0], "alpha": [0.1, 0.01], "valuation": ["owen", "none"]})
    fake = FakeFlwr([])
    runner = make_runner(tmp_path, fake, raw)
    # Execute
    runner.run(where={"alpha": 0.01})
    # Assert: one setting's cells alone; a value no cell has is an error that says what to give
    assert sorted((c["alpha"], c["valuation"]) for c in fake.calls) == [(0.01, "none"),
                                                                         (0.01, "owen")]
    with pytest.raises(KeyError, match=r"alpha=0\.5 matches none of the 4 cells"):
        runner.selected_cells(where={"alpha": 0.5})


def test_status_counts_each_grids_finished_cells(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: two grids, the first run whole, the second not at all
    from sim.experiments import main

    raw = small_preset(axes={"seed": [0], "valuation": ["owen", "none"]})
    raw["grid"].append({"name": "other", "axes": {"seed": [1], "valuation": ["none"]}})
    runner = make_runner(tmp_path, FakeFlwr([]), raw)
    runner.run(grids=[raw["grid"][0]["name"]])
    # Execute
    main(["status", "--results", str(tmp_path / "res")])
    # Assert
    out = capsys.readouterr().out
    assert f"by grid: {raw['grid'][0]['name']} 2/2, other 0/1" in out


def test_where_reads_its_value_as_toml_else_as_text() -> None:
    from sim.experiments import parse_args

    args = parse_args(["run", "conf/x.toml", "--where", "alpha=0.01", "--where",
                       "variant=fedowen"])
    assert args.where == {"alpha": 0.01, "variant": "fedowen"}
    with pytest.raises(SystemExit):
        parse_args(["run", "conf/x.toml", "--where", "alpha"])


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


@pytest.mark.slow
@pytest.mark.e2e
def test_real_flwr_run_preset_resumes_and_reports(tmp_path: Path, shared_data_dir: Path) -> None:
    """One tiny cell through a real ``flwr run`` (Ray); a second invocation skips it."""
    from fedowen_deploy.launcher import LocalSuperLink, flwr_run

    # Prepare
    raw = {"preset": {"name": "e2e", "num-supernodes": 4, "cell-timeout": 600},
           "base": {"dataset": "mnist", "num-server-rounds": 2, "clients-per-round": 2,
                    "client-max-samples": 50, "test-max-samples": 500},
           "grid": [{"name": "t", "axes": {"seed": [0], "valuation": ["owen"]}}]}
    preset = parse_preset(raw)
    runner = Runner(preset, tmp_path / "res", shared_data_dir, run_fn=flwr_run,
                    link_factory=LocalSuperLink, progress=lambda msg: None)
    # Execute
    first = runner.run()
    second = runner.run()
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert
    assert first["done"] == 1 and second["done"] == 1
    assert len(read_state(tmp_path / "res")[preset.cells()[0].cell_id]) == 1
    assert "Cells finished: 1 of 1" in (tmp_path / "out" / "README.md").read_text()


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
