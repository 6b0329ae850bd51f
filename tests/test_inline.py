"""Tests for sim.inline: the cell process's thread settings follow the run config."""

from __future__ import annotations

import os

import pytest

from sim.inline import child_env
from sim.launcher import APP_DIR


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
