"""A Flower user's first hour, as the README tells it, in one fresh copy of the repository:
``scripts/run.sh`` and then the README's own ``flwr run`` (Flower's local SuperLink under
``FLWR_HOME=.flwr-home``). Both must complete, draw their plots and keep the log short; the
first must not leave ``.flwr-home`` pointing at a SuperLink that is gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedowen_deploy.launcher import APP_DIR
from fedowen_deploy.procs import alive, descendants, send_signal
from server_app.store.records import read_rounds

pytestmark = pytest.mark.e2e
SMALL = "client-max-samples=50 test-max-samples=300"


def _clone(dst: Path) -> Path:
    """The tracked (and new, unignored) files of this checkout, as a fresh clone has them."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=APP_DIR, check=True, capture_output=True, text=True).stdout
    for name in files.splitlines():
        src = APP_DIR / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


def _stop_local_superlink(flwr_home: Path) -> None:
    """Flower's local SuperLink is detached from ``flwr run``: find it by its log path."""
    marker = str(flwr_home / "local-superlink")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            pid = int(entry.name)
            for child in [*descendants(pid), pid]:
                if alive(child):
                    send_signal(child, signal.SIGKILL)


def test_run_sh_then_the_readmes_flwr_run_in_one_clone(shared_data_dir: Path,
                                                        tmp_path: Path) -> None:
    # Prepare
    clone = _clone(tmp_path / "clone")
    home = clone / ".flwr-home"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    first, second = tmp_path / "run-sh", tmp_path / "flwr-run"
    try:
        # Execute: the quick check the README starts with
        sh = subprocess.run(
            ["bash", "scripts/run.sh", "--rounds", "2", "--supernodes", "4",
             "--clients-per-round", "2", "--data-dir", str(shared_data_dir), "--output-dir",
             str(first), *[a for kv in SMALL.split() for a in ("--set", kv)]],
            cwd=clone, env=env, capture_output=True, text=True, timeout=600)
        # then the Flower way, with the README's environment
        flwr_env = {**env, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
                    "FLWR_DISABLE_UPDATE_CHECK": "1",
                    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        flwr = subprocess.run(
            ["flwr", "run", ".", "--stream", "--federation-config",
             "num-supernodes=4 client-resources-num-cpus=1", "--run-config",
             f"num-server-rounds=2 clients-per-round=2 data-dir='{shared_data_dir}' "
             f"output-dir='{second}' {SMALL}"],
            cwd=clone, env=flwr_env, capture_output=True, text=True, timeout=600)
    finally:
        _stop_local_superlink(home)
    # Assert: both completed (flwr run exits 0 even on failure: its records say), with plots
    out = sh.stdout + sh.stderr
    assert sh.returncode == 0 and "completed. Results in" in out, out[-4000:]
    assert flwr.returncode == 0, (flwr.stdout + flwr.stderr)[-4000:]
    for run_dir in (first, second):
        assert [r["round"] for r in read_rounds(run_dir)] == [0, 1, 2]
        assert (run_dir / "summary.json").is_file()
        assert (run_dir / "plots" / "accuracy.png").is_file()
        assert (run_dir / "plots" / "payouts.png").is_file()
    # run.sh kept its SuperLink out of the README's FLWR_HOME; its log stays short
    assert not (home / "config.toml").exists() or "fedowen-sim" not in (
        home / "config.toml").read_text()
    assert len(out.strip().splitlines()) < 60, out
    streamed = flwr.stdout + flwr.stderr  # the README's flwr run --stream: as quiet
    assert len(streamed.strip().splitlines()) < 60, streamed
    assert "Traceback" not in out and "Traceback" not in streamed
    # no library warning the user cannot act on (torch's read-only arrays, Ray's future
    # default: silenced where they arise)
    for log_text in (out, streamed):
        assert "UserWarning" not in log_text and "FutureWarning" not in log_text, log_text
