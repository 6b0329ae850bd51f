"""Sweep cells as Ray tasks on a running Ray cluster (``sim.experiments run --ray-address``).

Ray runs the cluster (``ray start --head`` and ``ray start --address``; docs/deployment.md,
section 8); this module only submits work to it: one task per cell, with the resource request
``--cell-cpus`` / ``--cell-gpus``. A task runs its cell with the inline backend (the process
:func:`sim.inline.inline_run` starts: the real ServerApp and ClientApp code, no SuperLink) in a
temporary folder of whichever node Ray picked, and returns the cell's files; the driver writes
them to ``<results>/<cell-id>/``, where the runner's resume logic looks, so no shared file
system is needed. A partial cell's files travel to its task, which resumes the cell from its
checkpoint.

Every node needs this checkout at the same path in the same venv (its tasks import ``sim``
from there) and the data at the runner's ``--data-dir`` path; a task on a node without the
data fails at once, naming the node.

Retries and their reports are the runner's (:mod:`sim.runner`): Ray's own retries are off, so
a failed task is retried once, written to ``cells.jsonl`` with the tail of its log, then
marked failed. A stopped runner (SIGTERM, Ctrl-C) kills its tasks' workers; their cell
processes end with them (``DIE_WITH_PARENT``) and the next task on the node removes the
folders they leave.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedowen_deploy.launcher import APP_DIR, RunOutcome
from fedowen_deploy.procs import SIGNALS, stopping
from sim.cluster_task import pack, run_cell_task, unpack

log = logging.getLogger(__name__)
PROBE_SECONDS = 15.0  # a dead GCS makes ray.init retry for minutes: the probe gives up first
TCP_SECONDS = 3.0
#: A task's result arrives this long after its cell's own timeout, or counts as lost.
RESULT_GRACE = 120.0
CANCEL_GRACE = 10.0  # seconds to wait for a cancelled task's end


class ClusterUnreachable(RuntimeError):
    """No usable Ray cluster at the address given; the message says how to start one."""


def split_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` or ``ray://host:port``; None for ``auto``."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host, int(port)


def ray_start_command(address: str) -> str:
    """The ``ray start`` command that makes a head node answer at ``address``."""
    parts = split_address(address)
    if parts is None:
        return "ray start --head"
    host, port = parts
    flag = "--ray-client-server-port" if address.startswith("ray://") else "--port"
    where = "" if host in ("127.0.0.1", "localhost") else f" --node-ip-address={host}"
    return f"ray start --head{where} {flag}={port}"


def _unreachable(address: str, why: str) -> ClusterUnreachable:
    parts = split_address(address)
    host = "this machine" if parts is None or parts[0] in ("127.0.0.1", "localhost") \
        else parts[0]
    join = "" if parts is None or address.startswith("ray://") else \
        f", then `ray start --address={parts[0]}:{parts[1]}` on each worker"
    return ClusterUnreachable(
        f"--ray-address {address}: no Ray cluster there ({why}). Start its head with "
        f"`{ray_start_command(address)}` on {host}{join}, or pass the address that "
        "`ray start --head` printed")


_PROBE = """
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
print(json.dumps({"nodes": nodes, "resources": ray.cluster_resources()}))
"""


def probe(address: str, timeout: float = PROBE_SECONDS) -> dict[str, Any]:
    """Check that a Ray cluster answers at ``address``: its live nodes' resources.

    A refused port fails at once; otherwise a child process connects (``ray.init`` waits
    minutes on an address where no GCS answers) and is given up after ``timeout`` seconds.
    Raises :class:`ClusterUnreachable` naming the address and the ``ray start`` command.
    """
    parts = split_address(address)
    if parts is None and address != "auto":
        raise _unreachable(address, "not host:port, ray://host:port or auto")
    if parts is not None:
        try:
            socket.create_connection(parts, TCP_SECONDS).close()
        except OSError as err:
            raise _unreachable(address, f"{parts[0]}:{parts[1]}: {err.strerror or err}") \
                from None
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise _unreachable(address, f"no answer within {timeout:.0f}s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise _unreachable(address, f"ray.init failed: {last[:300]}")
    info: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return info


def node_label(result: dict[str, Any]) -> str:
    """``ip (node id prefix)`` of a task result."""
    return f"{result.get('ip', '?')} ({str(result.get('node', ''))[:8]})"


@dataclass
class ClusterSession:
    """A driver connected to a cluster; :meth:`run_fn` is the runner's ``run_fn``."""

    address: str
    nodes: list[dict[str, float]]
    cell_cpus: float = 1.0
    cell_gpus: float = 0.0
    progress: Callable[[str], None] = field(default=lambda msg: log.info("%s", msg))
    _task: Any = None

    @property
    def slots(self) -> int:
        """How many cells the cluster runs at once (per node, by CPUs and GPUs)."""
        total = 0
        for res in self.nodes:
            fits = [res.get("CPU", 0.0) / self.cell_cpus] if self.cell_cpus > 0 else []
            if self.cell_gpus > 0:
                fits.append(res.get("GPU", 0.0) / self.cell_gpus)
            total += int(min(fits)) if fits else 1
        return total

    def describe(self) -> str:
        cpus = sum(r.get("CPU", 0.0) for r in self.nodes)
        gpus = sum(r.get("GPU", 0.0) for r in self.nodes)
        return (f"Ray cluster {self.address}: {len(self.nodes)} nodes, {cpus:g} CPUs, "
                f"{gpus:g} GPUs; {self.slots} cells at a time ({self.cell_cpus:g} CPU, "
                f"{self.cell_gpus:g} GPU each)")

    def run_fn(self, _link: Any, run_config: dict[str, Any], *, num_supernodes: int,
               cpus_per_client: float = 1.0, timeout: float = 3600,
               stream_to: Any = None) -> RunOutcome:
        """Run one cell as a Ray task and write its files where the runner expects them."""
        import ray

        out = Path(str(run_config["output-dir"]))
        files = pack(out) if run_config.get("resume-from") else {}
        started = time.monotonic()
        ref = self._task.remote(run_config, files, num_supernodes, timeout)
        while not ray.wait([ref], timeout=1.0)[0]:
            if stopping():  # SIGTERM to the runner: end the task's worker, and so its cell
                self._cancel(ref)
                return RunOutcome(None, "interrupted", "")
            if time.monotonic() - started > timeout + RESULT_GRACE:
                self._cancel(ref)
                return self._lost(stream_to, f"no result within {timeout + RESULT_GRACE:.0f}s")
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as err:  # the worker or its node died
            return self._lost(stream_to, f"{type(err).__name__}: {str(err).splitlines()[0]}")
        unpack(result["files"], out)
        seconds, status = time.monotonic() - started, str(result["status"])
        if stream_to is not None:  # the node last: the runner keeps a failed log's tail
            stream_to.write(result["log"] + f"[cluster] ran on node {node_label(result)} in "
                            f"{seconds:.0f}s: {status}\n")
            stream_to.flush()
        ok = status == "finished:completed"
        self.progress(f"  [{out.name}] {'done' if ok else 'failed'} on node "
                      f"{node_label(result)} in {seconds:.0f}s")
        return RunOutcome(None, status, result["log"])

    @staticmethod
    def _cancel(ref: Any) -> None:
        """Kill the task's worker (Ray 2.55 does not interrupt a running task without
        ``force``); its cell process follows (``DIE_WITH_PARENT``)."""
        import ray

        ray.cancel(ref, force=True)
        ray.wait([ref], timeout=CANCEL_GRACE)

    def _lost(self, stream_to: Any, why: str) -> RunOutcome:
        if stream_to is not None:
            stream_to.write(f"[cluster] task lost: {why}\n")
            stream_to.flush()
        return RunOutcome(None, f"finished:failed (ray task: {why})", "")


def _signal_handlers() -> dict[signal.Signals, Any]:
    """The Python handlers of SIGTERM, SIGINT and SIGHUP now (none off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    found = {sig: signal.getsignal(sig) for sig in SIGNALS}
    return {sig: handler for sig, handler in found.items() if handler is not None}


@contextmanager
def connect(address: str, *, cell_cpus: float = 1.0, cell_gpus: float = 0.0,
            timeout: float = PROBE_SECONDS) -> Iterator[ClusterSession]:
    """Attach this process to the cluster at ``address`` for the block (:func:`probe` first,
    so a wrong address fails within ``timeout`` seconds); cells' tasks import ``sim`` from
    this checkout's path on every node."""
    if cell_cpus < 0 or cell_gpus < 0 or cell_cpus + cell_gpus == 0:
        raise ValueError(f"cell resources cpus={cell_cpus}, gpus={cell_gpus}: give a cell "
                         "at least some CPU or GPU")
    info = probe(address, timeout)
    nodes = info["nodes"]
    if not any(r.get("CPU", 0.0) >= cell_cpus and r.get("GPU", 0.0) >= cell_gpus
               for r in nodes):
        raise ClusterUnreachable(
            f"--ray-address {address}: no node has {cell_cpus:g} CPUs and {cell_gpus:g} GPUs "
            f"for a cell (nodes: {nodes}); lower --cell-cpus / --cell-gpus or add a node with "
            "`ray start --address=<head> --num-cpus=N --num-gpus=G`")
    import ray

    handlers = _signal_handlers()
    with warnings.catch_warnings():  # a tip about a future default, nothing to act on
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray\._private")
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(APP_DIR)}})
    # ray.init replaces SIGTERM's handler with its own (a crash report, then death): give the
    # runner's back (fedowen_deploy.procs.exit_on_signals), so a stopped sweep cancels its tasks
    # cleanly
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    task = ray.remote(run_cell_task).options(num_cpus=cell_cpus, num_gpus=cell_gpus,
                                             max_retries=0, name="fedowen-cell")
    try:
        yield ClusterSession(address, nodes, cell_cpus, cell_gpus, _task=task)
    finally:
        ray.shutdown()
