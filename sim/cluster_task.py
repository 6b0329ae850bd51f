"""A sweep cell's Ray task, on whichever worker node Ray picked (:mod:`sim.cluster` submits it):
the driver's files of the cell travel in, the cell runs with the inline backend in a temporary
folder, and its files travel back. A task's folder is named after its worker's pid, so the next
task on the node removes the folders of workers killed mid-cell.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedowen_deploy.launcher import APP_DIR
from sim.cell_state import MACHINE_FILE, machine_state

CELL_DIR_PREFIX = "fedowen-cell-"  # + the worker's pid: folders of dead workers are removed
DRIVER_LOG = "flwr.log"  # the runner's log of the cell: stays with the driver


def pack(folder: Path, skip: tuple[str, ...] = (DRIVER_LOG,)) -> dict[str, bytes]:
    """Every file under ``folder`` (relative POSIX path -> bytes), except the names in
    ``skip``; empty when the folder does not exist."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in skip}


def unpack(files: dict[str, bytes], folder: Path) -> None:
    """Write :func:`pack`'s files under ``folder`` (paths that leave it are refused)."""
    root = folder.resolve()
    for name, data in files.items():
        path = (folder / name).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"file {name!r} would leave {folder}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def run_cell_task(run_config: dict[str, Any], files: dict[str, bytes], num_supernodes: int,
                  timeout: float) -> dict[str, Any]:
    """A cell's Ray task, on the worker node: unpack what the driver has of the cell (a
    resumed cell's checkpoint and records), run it inline in a temporary folder, return its
    status, log, files and the node it ran on."""
    import ray

    node = {"node": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(), "host": socket.gethostname()}
    data = Path(str(run_config["data-dir"]))
    if not data.is_dir():
        return {**node, "status": f"error: data-dir {data} does not exist on node {node['ip']} "
                f"({node['host']}): every node needs the data at this path", "log": "",
                "files": {}}
    _remove_orphans()
    with tempfile.TemporaryDirectory(prefix=f"{CELL_DIR_PREFIX}{os.getpid()}-") as tmp:
        out = Path(tmp) / "cell"
        unpack(files, out)
        cfg = {**run_config, "output-dir": str(out)}
        if cfg.get("resume-from"):
            cfg["resume-from"] = str(out)
        status, text = _run_inline(cfg, num_supernodes, timeout, out, Path(tmp) / "cell.log")
        # the runner records this node, not its own machine (sim.cell_state.note_machine)
        machine = machine_state(str(cfg.get("device", "auto")))
        (out / MACHINE_FILE).write_text(json.dumps(machine))
        return {**node, "status": status, "log": text, "files": pack(out)}


def _remove_orphans() -> None:
    """Remove cell folders of this node whose worker is gone (a cancelled task's worker is
    killed before it can clean up)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{CELL_DIR_PREFIX}*-*"):
        pid = folder.name.removeprefix(CELL_DIR_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def _run_inline(cfg: dict[str, Any], num_supernodes: int, timeout: float, out: Path,
                log_path: Path) -> tuple[str, str]:
    """The cell's process, as :func:`sim.inline.inline_run` starts it, waited for by polling
    up to ``timeout`` seconds, ended with this worker if the worker is killed (a cancelled
    task); returns (status, log)."""
    from fedowen_deploy.procs import stop_tree
    from sim.inline import COMPLETED, DIE_WITH_PARENT, child_env

    out.mkdir(parents=True, exist_ok=True)
    cfg_file = out / "inline-run-config.json"
    cfg_file.write_text(json.dumps(cfg, indent=1))
    env = {**child_env(cfg), DIE_WITH_PARENT: str(os.getpid())}
    cmd = [sys.executable, "-m", "sim.inline", "--run-config", str(cfg_file),
           "--num-supernodes", str(num_supernodes)]
    deadline = time.monotonic() + timeout
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=APP_DIR, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            stop_tree(proc, grace=5)
    text = log_path.read_text(errors="replace")
    if proc.returncode == 0:
        return COMPLETED, text
    late = f", timed out after {timeout:.0f}s" if time.monotonic() >= deadline else ""
    return f"finished:failed (exit {proc.returncode}{late})", text
