"""The GPU script's driver and summary (benchmarks/gpu_resnet18*.py) on hand-built records: its
run configs are valid, its arms are the second confirmation's, and the numbers it reports are
the ones computed by hand here (no run, no GPU)."""

from __future__ import annotations

import csv
import gzip
import json
import tarfile
from pathlib import Path

import pytest

from benchmarks.gpu_resnet18 import ARMS, PHASES, read_rounds, run_config
from benchmarks.gpu_resnet18_summary import pack_records, run_stats, write_summary
from server_app.config import parse_run_config
from sim.presets import load_preset

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("profile", sorted(PHASES))
def test_every_phase_run_config_parses(profile: str, tmp_path: Path) -> None:
    # Prepare / Execute: every run config the phases would start (cuda swapped for cpu: the
    # GPU profile's device fails where there is none, on purpose)
    for phase in PHASES[profile]:
        cfg = run_config(profile, phase, phase.first_seed, tmp_path / phase.name, "/tmp/data")
        parsed = parse_run_config({**cfg, "device": "cpu"})
        # Assert
        assert parsed.num_server_rounds == phase.rounds
        assert parsed.clients_per_round == 10
        assert parsed.seed == phase.first_seed


def test_fedavg_equal_is_the_confirmation_arm() -> None:
    # Prepare / Execute
    preset = load_preset(ROOT / "conf" / "confirm2" / "cifar10.toml")
    # Assert
    assert preset.variants["fedavg-equal"] == ARMS["fedavg-equal"]
    assert ARMS["fedowen"] == {}


def test_read_rounds_skips_a_line_being_written(tmp_path: Path) -> None:
    # Prepare
    path = tmp_path / "rounds.jsonl"
    path.write_text('{"round": 0}\n{"round": 1}\n{"round": 2, "sel')
    # Execute / Assert
    assert read_rounds(path) == [{"round": 0}, {"round": 1}]


def _round(k: int, secs: float, val: float | None, elapsed: float, acc: float,
           loss: float, rejected: int = 0) -> dict[str, object]:
    rec: dict[str, object] = {"round": k, "round_seconds": secs, "elapsed_seconds": elapsed,
                              "test_accuracy": acc, "test_loss": loss}
    if k:
        rec.update(returned=[str(i) for i in range(10)],
                   rejected={str(i): "shape" for i in range(rejected)}, failed={})
    if val is not None:
        rec["valuation_seconds"] = val
    return rec


ROUNDS = [_round(0, 0.0, None, 0.5, 0.10, 2.30),
          _round(1, 9.0, 3.0, 10.0, 0.20, 2.10),       # warm-up: left out of the timings
          _round(2, 2.0, 0.5, 12.5, 0.30, 1.90),
          _round(3, 4.0, 1.5, 17.0, 0.25, 1.95, rejected=10),
          _round(4, 3.0, 1.0, 20.5, 0.35, 1.80)]


def test_run_stats_by_hand() -> None:
    # Execute
    stats = run_stats(ROUNDS)
    # Assert: rounds 2-4 timed; walls 2.5, 4.5, 3.5; valuation 3.0 of 9.0 s
    assert stats["rounds_done"] == 4
    assert stats["round_seconds_median"] == 3.0
    assert stats["wall_seconds_median"] == 3.5
    assert stats["valuation_seconds_median"] == 1.0
    assert stats["valuation_share"] == pytest.approx(3.0 / 9.0, abs=1e-4)
    assert (stats["rejected"], stats["rounds_all_rejected"]) == (10, 1)
    assert (stats["initial_test_loss"], stats["final_test_loss"]) == (2.30, 1.80)
    assert stats["best_test_accuracy"] == 0.35


def _phase(runs: Path, name: str, arm: str, jobs: int, started: float) -> None:
    pdir = runs / name
    pdir.mkdir(parents=True)
    (pdir / "phase.json").write_text(json.dumps(
        {"name": name, "arm": arm, "jobs": jobs, "rounds": 4, "cap_s": 60, "first_seed": 0,
         "started": started, "seconds": 30.0, "cut": [], "exit_codes": {}}))
    for seed in range(jobs):
        (pdir / f"s{seed}.json").write_text(json.dumps({"seed": seed}))
        (pdir / f"s{seed}").mkdir()
        (pdir / f"s{seed}" / "rounds.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in ROUNDS))
        (pdir / f"s{seed}" / "final_model.pt").write_bytes(b"0" * 100)


def test_write_summary_and_pack(tmp_path: Path) -> None:
    # Prepare: an alone phase and a phase of two runs at once, GPU samples of both
    runs = tmp_path / "runs"
    _phase(runs, "alone-fedowen", "fedowen", 1, started=1.0)
    _phase(runs, "concurrent-2", "fedowen", 2, started=2.0)
    (runs / "gpu.csv").write_text("1.0,alone-fedowen,40,1000\n2.0,alone-fedowen,60,3000\n"
                                  "3.0,concurrent-2,90,5000\n")
    out = tmp_path / "out"
    # Execute
    summary = write_summary(runs, out)
    pack_records(runs, out / "records.tar.gz")
    # Assert
    first, second = summary["phases"]
    assert (first["name"], second["name"]) == ("alone-fedowen", "concurrent-2")
    assert first["gpu"] == {"util_mean": 50.0, "util_max": 60.0,
                            "mem_max_mib": 3000.0, "samples": 2}
    assert second["rounds_per_hour_machine"] == round(2 * 3600 / 3.5, 1)
    assert summary["checks"]["no_rejected_replies"] is False
    assert summary["checks"]["smoke_loss_fell"] == {"fedowen": [True]}
    with (out / "concurrency.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["concurrency"] for r in rows] == ["1", "2"]
    assert rows[1]["rounds_done"] == "8"
    with gzip.open(out / "smoke-rounds.csv.gz", "rt") as fh:
        assert len(list(csv.DictReader(fh))) == len(ROUNDS)
    assert (out / "smoke-accuracy.png").stat().st_size > 0
    with tarfile.open(out / "records.tar.gz") as tar:
        names = tar.getnames()
    assert "runs/alone-fedowen/s0/rounds.jsonl" in names
    assert not any(n.endswith(".pt") for n in names)


def test_gpu_backbone_arms_are_the_backbone_grid_cells(tmp_path: Path) -> None:
    # Prepare: backbone-dev's cells of seed 0 (model, lr) and its base keys
    preset = load_preset(ROOT / "conf" / "backbone-dev.toml")
    base = {k: v for k, v in preset.base.items() if k != "num-server-rounds"}
    cells = {(g.fixed["model"], lr) for g in preset.grids for lr in g.axes["lr"]}
    # Execute
    configs = [run_config("gpu-backbone", phase, 0, tmp_path / phase.name, "/tmp/data")
               for phase in PHASES["gpu-backbone"]]
    # Assert: one phase per cell, each the cell's keys on the GPU at 30 rounds
    assert len(configs) == 4
    assert {(c["model"], c["lr"]) for c in configs} == cells
    for cfg in configs:
        assert {k: cfg[k] for k in base} == base
        assert (cfg["device"], cfg["num-server-rounds"]) == ("cuda", 30)
