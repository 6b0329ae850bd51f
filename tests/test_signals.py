"""SIGTERM to ``scripts/run.sh`` or ``python -m fedowen_deploy.rehearsal`` stops every process
they started.

Each test starts the real command in its own session, waits until the deepest processes
exist (Ray's for a simulation, the ServerApp for a deployment), records the whole process
tree, sends SIGTERM to the command alone and asserts that every recorded process is gone.
Whatever survives a failed assertion is stopped by pid in ``finally``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fedowen_deploy.launcher import APP_DIR, BIN
from fedowen_deploy.procs import alive, descendants, send_signal, stop_tree


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _tree(pid: int) -> dict[int, str]:
    return {p: _cmdline(p) for p in descendants(pid)}


def _wait_for(proc: subprocess.Popen[bytes], ready: Callable[[dict[int, str]], bool],
              timeout: float, log: Path) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"exited early ({proc.returncode}):\n{log.read_text()[-3000:]}")
        tree = _tree(proc.pid)
        if ready(tree):
            return tree
        time.sleep(0.5)
    pytest.fail(f"not ready after {timeout:.0f}s: {sorted(_tree(proc.pid).values())}\n"
                f"{log.read_text()[-3000:]}")


def _terminate_and_check(proc: subprocess.Popen[bytes], tree: dict[int, str], log: Path
                         ) -> None:
    tree.update(_tree(proc.pid))
    proc.send_signal(signal.SIGTERM)  # the command only, as `kill <pid>` would
    status = proc.wait(timeout=90)
    deadline = time.monotonic() + 15
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {p: c for p, c in tree.items() if alive(p)}
    assert not left, f"still running after SIGTERM: {left}"
    assert status == 128 + signal.SIGTERM, f"status {status}:\n{log.read_text()[-3000:]}"


def _cleanup(proc: subprocess.Popen[bytes], tree: dict[int, str]) -> None:
    """Stop what a failed test left: the command's tree and every pid recorded before."""
    stop_tree(proc, grace=5)
    for pid in tree:
        if alive(pid):
            send_signal(pid, signal.SIGKILL)


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(APP_DIR)}
    with log.open("wb") as sink:
        return subprocess.Popen(cmd, cwd=APP_DIR, env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.e2e
def test_sigterm_to_run_sh_stops_superlink_superexec_simulation_and_ray(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: a long simulation through scripts/run.sh (which execs python -m fedowen_deploy.cli)
    log = tmp_path / "run.log"
    proc = _start(["bash", str(APP_DIR / "scripts" / "run.sh"), "--rounds", "50",
                   "--supernodes", "2", "--clients-per-round", "2", "--valuation", "none",
                   "--data-dir", str(shared_data_dir), "--output-dir", str(tmp_path / "out"),
                   "--flwr-home", str(tmp_path / "home"), "--set", "client-max-samples=20",
                   "--set", "test-max-samples=100"], log)
    tree: dict[int, str] = {}
    try:
        # Execute: once Ray's actors exist and a round is checkpointed, SIGTERM the command
        out = tmp_path / "out"
        tree.update(_wait_for(proc, lambda t: any("ray::" in c for c in t.values()) and (
            out / "checkpoint.npz").is_file(), 180, log))
        assert any("flwr-simulation" in c for c in tree.values())
        assert any("flower-superlink" in c for c in tree.values())
        # Assert: everything stopped, and the last line is the command that resumes
        _terminate_and_check(proc, tree, log)
        last = log.read_text().strip().splitlines()[-1]
        assert "resume with: bash scripts/run.sh --rounds 50" in last, last
        assert last.endswith(f"--set resume-from={out}") and "--output-dir" not in last
    finally:
        _cleanup(proc, tree)


@pytest.mark.e2e
def test_sigterm_to_sim_deploy_stops_superlink_supernodes_and_serverapp(
        shared_data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "deploy.log"
    proc = _start([str(BIN / "python"), "-m", "fedowen_deploy.rehearsal", "--work-dir",
                   str(tmp_path / "w"),
                   "--nodes", "2", "--set", "num-server-rounds=50",
                   "--set", "clients-per-round=2", "--set", "client-max-samples=20",
                   "--set", "test-max-samples=100", "--set", f'data-dir="{shared_data_dir}"',
                   "--set", f'output-dir="{tmp_path / "out"}"'], log)
    tree: dict[int, str] = {}
    try:
        def running(t: dict[int, str]) -> bool:
            nodes = sum("flower-supernode" in c for c in t.values())
            return nodes == 2 and any("flwr-serverapp" in c for c in t.values())

        tree.update(_wait_for(proc, running, 180, log))
        _terminate_and_check(proc, tree, log)
    finally:
        _cleanup(proc, tree)


@pytest.mark.e2e
def test_sigterm_to_parallel_inline_sweep_stops_its_cells_and_starts_no_more(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: four long cells, two at a time, on the inline backend
    preset = tmp_path / "long.toml"
    preset.write_text(
        '[preset]\nname = "long"\nnum-supernodes = 4\nbackend = "inline"\n'
        '[base]\ndataset = "mnist"\nnum-server-rounds = 200\nclients-per-round = 2\n'
        'valuation = "none"\nclient-max-samples = 20\ntest-max-samples = 100\n'
        '[[grid]]\nname = "g"\naxes = { seed = [0, 1, 2, 3] }\n')
    log = tmp_path / "sweep.log"
    proc = _start([str(BIN / "python"), "-m", "sim.experiments", "run", str(preset), "--jobs",
                   "2", "--results", str(tmp_path / "res"), "--data-dir", str(shared_data_dir)],
                  log)
    tree: dict[int, str] = {}
    try:
        # Execute: once both cells run, SIGTERM the runner alone
        tree.update(_wait_for(proc, lambda t: sum("sim.inline" in c for c in t.values()) == 2,
                              120, log))
        _terminate_and_check(proc, tree, log)
        # Assert: no third cell was started during the cleanup, and the two stopped cells are
        # neither retried nor marked failed (a later invocation resumes them)
        started = [d for d in (tmp_path / "res").iterdir() if (d / "inline-run-config.json")
                   .exists()]
        assert len(started) == 2, sorted(d.name for d in started)
        events = (tmp_path / "res" / "cells.jsonl")
        recorded = events.read_text().splitlines() if events.exists() else []
        assert not [e for e in recorded if '"failed"' in e or '"error"' in e], recorded
    finally:
        _cleanup(proc, tree)
