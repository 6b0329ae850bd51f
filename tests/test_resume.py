"""Crash-safe resume: kill the server process mid-run, resume, compare with an uninterrupted run.

Also the checkpoint format itself: atomic, round-tripping arrays and generator states.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from server_app.store.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    check_run_config,
    load_checkpoint,
    save_checkpoint,
)
from server_app.store.records import read_rounds

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(3, np.int64)}
    rng = np.random.default_rng(5)
    rng.random(7)
    path = save_checkpoint(tmp_path / CHECKPOINT_FILE, 4, state,
                           {"phi": {"a": 0.5}, "rng": rng.bit_generator.state})
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.server_round == 4 and ckpt.strategy_state["phi"] == {"a": 0.5}
    np.testing.assert_array_equal(ckpt.global_state["w"], state["w"])
    assert ckpt.global_state["n"].dtype == np.int64
    again = np.random.default_rng(0)
    again.bit_generator.state = ckpt.strategy_state["rng"]
    assert again.random() == rng.random()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_missing_checkpoint_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_checkpoint(tmp_path)


def _config(shared_data_dir: Path, out: Path, **extra: Any) -> dict[str, Any]:
    return {"dataset": "mnist", "data-dir": str(shared_data_dir), "output-dir": str(out),
            "num-server-rounds": 5, "clients-per-round": 3, "client-max-samples": 100,
            "test-max-samples": 300, "alpha": 0.5, "imbalance-factor": 0.5, **extra}


def _server(config: dict[str, Any], tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    cfg_file = tmp_path / f"{name}.json"
    cfg_file.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "sim.inline", "--run-config", str(cfg_file),
                             "--num-supernodes", "6"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def _finish(proc: subprocess.Popen[bytes]) -> str:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    return err.decode()


@pytest.mark.e2e
def test_killed_server_resumes_to_the_same_rounds(shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: an uninterrupted reference run and a run we kill after its 2nd checkpoint
    ref_out, crash_out = tmp_path / "ref", tmp_path / "crash"
    _finish(_server(_config(shared_data_dir, ref_out), tmp_path, "ref"))
    proc = _server(_config(shared_data_dir, crash_out), tmp_path, "crash")
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if (crash_out / CHECKPOINT_FILE).exists() and \
                    load_checkpoint(crash_out).server_round >= 2:
                break
            time.sleep(0.05)
        # Execute: SIGKILL, no chance to clean up
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    killed_after = load_checkpoint(crash_out).server_round
    assert killed_after < 5 and not (crash_out / "summary.json").exists(), "killed too late"
    resume = _config(shared_data_dir, tmp_path / "unused") | {"resume-from": str(crash_out),
                                                                 "verbose": True}
    log = _finish(_server(resume, tmp_path, "resume"))
    # Assert: the log numbers rounds as the run does ("3/5", not "1/3"): the progress line
    # and, verbose, Flower's banner
    nxt = killed_after + 1
    assert f"round {nxt}/5: test accuracy" in log and f"[ROUND {nxt}/5]" in log, log[-3000:]
    assert "[ROUND 1/" not in log and "round 1/5:" not in log
    # the resumed run's rounds equal the reference's, record for record
    ref, resumed = read_rounds(ref_out), read_rounds(crash_out)
    assert [r["round"] for r in resumed] == [0, 1, 2, 3, 4, 5]
    for a, b in zip(ref[1:], resumed[1:], strict=True):
        assert a["selected"] == b["selected"]
        assert a["phi"] == pytest.approx(b["phi"], abs=1e-9)
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1e-12)
    ref_model = torch.load(ref_out / "final_model.pt")
    res_model = torch.load(crash_out / "final_model.pt")
    for key, value in ref_model.items():
        torch.testing.assert_close(value, res_model[key], rtol=0, atol=1e-6)
    summary = json.loads((crash_out / "summary.json").read_text())
    assert summary["resumed_after_round"] == killed_after


# --- resume refuses the wrong checkpoint ---------------------------------------------------


def test_checkpoint_records_config_and_refuses_a_different_one(tmp_path: Path) -> None:
    state = {"w": np.ones(3, np.float32)}
    cfg = {"dataset": "mnist", "seed": 0, "valuation": "owen"}
    save_checkpoint(tmp_path / CHECKPOINT_FILE, 2, state, {}, cfg)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.run_config == cfg
    check_run_config(ckpt, cfg, tmp_path)  # same settings: fine
    with pytest.raises(CheckpointError) as err:
        check_run_config(ckpt, {**cfg, "dataset": "fashion-mnist", "seed": 1}, tmp_path)
    assert "dataset='mnist' (now 'fashion-mnist'); seed=0 (now 1)" in str(err.value)
    assert "valuation" not in str(err.value)
    # a key added to the schema after the checkpoint was made: fine at its default only
    defaults = {"foolsgold-kappa": 1.0}
    check_run_config(ckpt, {**cfg, "foolsgold-kappa": 1.0}, tmp_path, defaults=defaults)
    with pytest.raises(CheckpointError, match=r"foolsgold-kappa=None \(now 2\.0\)"):
        check_run_config(ckpt, {**cfg, "foolsgold-kappa": 2.0}, tmp_path, defaults=defaults)


def test_nan_model_is_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / CHECKPOINT_FILE, 3, {"w": np.array([1.0, np.nan])}, {})
    with pytest.raises(CheckpointError, match=r"round 3\): array 'w' holds NaN or Inf"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("damage", [b"not a zip file", b""])
def test_damaged_checkpoint_gets_a_clear_message(tmp_path: Path, damage: bytes) -> None:
    (tmp_path / CHECKPOINT_FILE).write_bytes(damage)
    with pytest.raises(CheckpointError, match="damaged or not a FedOwen checkpoint"):
        load_checkpoint(tmp_path)


def test_edited_config_breaks_the_hash(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / CHECKPOINT_FILE, 1, {"w": np.ones(2)}, {}, {"seed": 0})
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["__strategy_state__"]))
    meta["run_config"]["seed"] = 1
    arrays["__strategy_state__"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError, match="does not match its hash"):
        load_checkpoint(tmp_path)


def test_torn_last_line_is_dropped_and_a_torn_middle_line_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "rounds.jsonl").write_text('{"round": 0}\n{"round": 1}\n{"round": 2, "te')
    assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1]
    (tmp_path / "rounds.jsonl").write_text('{"round": 0}\n{"rou\n{"round": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_rounds(tmp_path)


def _inprocess(shared_data_dir: Path, out: Path, handler: Any = None, **extra: Any
               ) -> dict[str, Any]:
    from client_app.app import train_handler
    from server_app.app import run
    from server_app.config import parse_run_config
    from sim.inline_grid import InProcessGrid

    config = _config(shared_data_dir, out, **{"num-server-rounds": 2, "clients-per-round": 2,
                                              "client-max-samples": 50,
                                              "test-max-samples": 200, **extra})
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    cfg = parse_run_config(config)
    return run(InProcessGrid(handler or train_handler, nodes, config), cfg,
               cfg.resolved_output_dir(1))


def test_resume_refuses_other_settings_keeps_a_finished_run_and_redoes_a_torn_round(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: a finished 2-round run
    out = tmp_path / "run"
    _inprocess(shared_data_dir, out)
    model_bytes = (out / "final_model.pt").read_bytes()
    # Execute / Assert: another seed or dataset is refused, naming the keys
    with pytest.raises(CheckpointError, match=r"seed=0 \(now 1\)"):
        _inprocess(shared_data_dir, tmp_path / "x", seed=1, **{"resume-from": str(out)})
    with pytest.raises(CheckpointError, match=r"dataset='mnist' \(now 'fashion-mnist'\)"):
        _inprocess(shared_data_dir, tmp_path / "x", dataset="fashion-mnist",
                   **{"resume-from": str(out)})
    # a finished run is reported as finished and its final model kept, byte for byte
    summary = _inprocess(shared_data_dir, tmp_path / "x", **{"resume-from": str(out)})
    assert summary["already_finished"] and summary["rounds"] == 2
    assert (out / "final_model.pt").read_bytes() == model_bytes
    # a torn last line of rounds.jsonl: dropped, and the run extended to 3 rounds goes on
    with (out / "rounds.jsonl").open("a") as fh:
        fh.write('{"round": 3, "selected": ["0"')
    summary = _inprocess(shared_data_dir, tmp_path / "x", **{"resume-from": str(out),
                                                            "num-server-rounds": 3})
    assert [r["round"] for r in read_rounds(out)] == [0, 1, 2, 3]
    assert summary["resumed_after_round"] == 2 and summary["aggregated_rounds"] == 3


def test_run_that_aggregated_nothing_says_so_and_keeps_the_initial_model(
        shared_data_dir: Path, tmp_path: Path) -> None:
    def crash(msg: Any, ctx: Any) -> Any:
        raise RuntimeError("out of memory")

    # max-stalled-rounds = 0: the run is not stopped (tests/test_stall.py: by default it is)
    summary = _inprocess(shared_data_dir, tmp_path, handler=crash, **{"max-stalled-rounds": 0})
    assert summary["aggregated_rounds"] == 0 and "initial model" in summary["warning"]
    state = torch.load(tmp_path / "final_model.pt")
    assert state, "final_model.pt is empty"
    from fedowen_task.models import build_model

    initial = build_model("lenet", 1, 10, seed=0).state_dict()
    for key, value in initial.items():
        torch.testing.assert_close(state[key], value)
    assert all(len(r["failed"]) == 2 for r in read_rounds(tmp_path)[1:])
