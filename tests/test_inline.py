"""Tests for sim.inline: the cell process's thread settings follow the run config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedowen_deploy.launcher import APP_DIR
from sim.inline import child_env


@pytest.mark.parametrize(("config", "expected"), [({}, "1"), ({"torch-threads": 1}, "1"),
                                                  ({"torch-threads": 3}, "3")])
def test_threads_follow_torch_threads(config: dict, expected: str) -> None:
    env = child_env(config)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == expected
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(APP_DIR)


def test_zero_threads_leaves_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    env = child_env({"torch-threads": 0})
    assert env["OMP_NUM_THREADS"] == "7" and "MKL_NUM_THREADS" not in env


def test_a_two_round_run_says_one_line_per_round_and_a_short_summary(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: the inline backend runs the same ServerApp code in a child process
    from sim.inline import inline_run

    cfg = {"dataset": "mnist", "data-dir": str(shared_data_dir), "output-dir": str(tmp_path),
           "num-server-rounds": 2, "clients-per-round": 4, "client-max-samples": 100,
           "test-max-samples": 300}
    # Execute
    outcome = inline_run(None, cfg, num_supernodes=8, timeout=300)
    # Assert: quiet by default: under 60 lines, one per round with an ETA, no traceback,
    # nothing of Flower's per-round records or its warning about federated evaluation
    lines = outcome.output.strip().splitlines()
    assert outcome.ok and len(lines) < 60, outcome.output
    assert sum("| ETA " in line for line in lines) == 2
    assert "Traceback" not in outcome.output and "MetricRecord" not in outcome.output
    assert "fraction_evaluate" not in outcome.output
    assert any("finished: 2 of 2 rounds aggregated" in line for line in lines)
