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

from fedowen_strategy.checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint
from fedowen_strategy.records import read_rounds

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


def _finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]


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
    resume = _config(shared_data_dir, tmp_path / "unused") | {"resume-from": str(crash_out)}
    _finish(_server(resume, tmp_path, "resume"))
    # Assert: the resumed run's rounds equal the reference's, record for record
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
