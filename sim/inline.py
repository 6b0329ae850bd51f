"""The inline backend: one cell in one process, no Ray and no SuperLink.

It runs exactly what ``flwr run`` runs, minus the transport: the ServerApp's
:func:`server_app.app.run` (the real ``FedOwen.start``, records and checkpoints) over an
:class:`~sim.inline_grid.InProcessGrid` whose nodes are served by the real ClientApp
(:data:`client_app.app.app`), with the node configs a Flower simulation gives its virtual
clients (``partition-id``, ``num-partitions``). For sweeps on one machine (cells in parallel
processes, ``python -m sim.experiments run PRESET --backend inline --jobs N``) and for
accelerator machines where Ray cannot be installed. ``flwr`` stays the default backend.

    python -m sim.inline --run-config cell.json --num-supernodes 100   # one cell, in this process
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedowen_deploy.launcher import APP_DIR, RunOutcome
from fedowen_deploy.procs import follow, stop_tree, tracked
from sim.grid import app_config

log = logging.getLogger(__name__)
COMPLETED = "finished:completed"
# The parent's pid, set by a parent that may die unannounced (a Ray worker: sim.cluster)
DIE_WITH_PARENT = "FEDOWEN_DIE_WITH_PARENT"


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the parent named in ``DIE_WITH_PARENT`` dies
    (and exit now if it already has)."""
    parent = os.environ.get(DIE_WITH_PARENT)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        raise SystemExit(f"[inline] parent {parent} is gone; not starting")


def run_cell(run_config: dict[str, Any], num_supernodes: int) -> dict[str, Any]:
    """Run one cell in this process; returns the ServerApp's summary."""
    from client_app.app import app as client_app
    from server_app.app import route_library_logs, run
    from server_app.config import parse_run_config
    from sim.inline_grid import InProcessGrid, task_identity

    cfg = parse_run_config(run_config)
    if num_supernodes < 1:
        raise ValueError(f"num_supernodes={num_supernodes} must be >= 1")
    nodes = [{"partition-id": i, "num-partitions": num_supernodes}
             for i in range(num_supernodes)]
    route_library_logs()
    with task_identity():
        grid = InProcessGrid(client_app, nodes, run_config)
        return run(grid, cfg, cfg.resolved_output_dir(0))


def child_env(run_config: dict[str, Any]) -> dict[str, str]:
    """The cell process's environment: this one, the app first on ``PYTHONPATH``, and OpenMP /
    MKL threads from ``torch-threads`` (the app's default 1; 0 leaves them as they are)."""
    env = {**os.environ, "PYTHONPATH": str(APP_DIR) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    threads = app_config(run_config).torch_threads
    if threads > 0:  # set before torch loads: its OpenMP pool is sized at import
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def inline_run(_link: Any, run_config: dict[str, Any], *, num_supernodes: int,
               cpus_per_client: float = 1.0, timeout: float = 3600,
               stream_to: Any = None) -> RunOutcome:
    """Run one cell in a child process (the runner's ``run_fn`` for the inline backend).

    The child's OpenMP/MKL threads follow the run config's ``torch-threads`` (default 1, as
    the ServerApp then sets torch's; 0 leaves the libraries' defaults); ``cpus_per_client`` is
    ignored (a cell is one process). Its output streams to ``stream_to``; past ``timeout``
    seconds it is killed.
    """
    out = Path(str(run_config["output-dir"]))
    out.mkdir(parents=True, exist_ok=True)
    cfg_file = out / "inline-run-config.json"
    cfg_file.write_text(json.dumps(run_config, indent=1))
    env = child_env(run_config)
    cmd = [sys.executable, "-m", "sim.inline", "--run-config", str(cfg_file),
           "--num-supernodes", str(num_supernodes)]
    proc = subprocess.Popen(cmd, env=env, cwd=APP_DIR, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        with tracked(proc):  # a SIGTERM to the runner stops it from the main thread
            lines, timed_out = follow(proc, stream_to, timeout)
        if timed_out:
            lines.append(f"[inline] timed out after {timeout:.0f}s; killed\n")
    finally:  # also on SIGTERM/SIGINT: no cell process is left behind
        stop_tree(proc, grace=5)
        if proc.stdout is not None:
            proc.stdout.close()
    code = proc.wait()
    status = COMPLETED if code == 0 else f"finished:failed (exit {code})"
    return RunOutcome(None, status, "".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-config", type=Path, required=True, help="JSON file of run-config keys")
    p.add_argument("--num-supernodes", type=int, default=100, help="virtual clients")
    args = p.parse_args(argv)
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    summary = run_cell(json.loads(args.run_config.read_text()), args.num_supernodes)
    print(f"[inline] completed: final test accuracy {summary['final_test_accuracy']}; "
          f"results in {summary['output_dir']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
