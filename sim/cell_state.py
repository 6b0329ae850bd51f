"""The files that hold a results folder's state: ``cells.jsonl`` (attempts and failures, one
event per line), each cell's ``summary.json`` (done), ``checkpoint.npz`` (resumable) and
``code.json`` (the code every attempt ran, and since issue 60 the machine it ran on).
:mod:`sim.runner` writes them; reports, archives and carry read them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

STATE_FILE = "cells.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT = "checkpoint.npz"
CODE_FILE = "code.json"
#: Where a cell that ran on another node (a Ray worker) leaves that node's :func:`machine_state`
#: for the runner to record; removed once recorded.
MACHINE_FILE = "machine.json"
REPO = Path(__file__).resolve().parents[1]
_STATE_LOCK = threading.Lock()  # parallel cells append to one cells.jsonl


def read_state(results: Path) -> dict[str, list[dict[str, Any]]]:
    """Events of ``cells.jsonl`` grouped by cell id, in order."""
    path = results / STATE_FILE
    events: dict[str, list[dict[str, Any]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                event = json.loads(line)
                events.setdefault(event["cell"], []).append(event)
    return events


def append_state(results: Path, event: dict[str, Any]) -> None:
    """Append one event (flushed at once) to ``cells.jsonl``."""
    results.mkdir(parents=True, exist_ok=True)
    with _STATE_LOCK, (results / STATE_FILE).open("a") as fh:
        fh.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **event}) + "\n")


def code_state(repo: Path = REPO) -> dict[str, Any]:
    """``{"commit": HEAD or None, "dirty": tracked files differ from it}`` of ``repo``."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit or None, "dirty": bool(status)}


def record_code(out: Path, attempt: int, resumed: bool) -> None:
    """Append this attempt's :func:`code_state` to ``out/code.json``, with the hash of the
    run-config defaults it runs under (:func:`server_app.keys.defaults_hash`; records written
    before issue 61 have none)."""
    from server_app.keys import defaults_hash

    path = out / CODE_FILE
    attempts = json.loads(path.read_text()) if path.exists() else []
    attempts.append({"attempt": attempt, "resumed": resumed,
                     "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **code_state(),
                     "defaults": defaults_hash()})
    path.write_text(json.dumps(attempts, indent=1) + "\n")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else the platform's word for it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The CPU's instruction sets that decide which kernels torch, oneDNN and OpenBLAS pick (and so
#: the last bits of every run): a virtual machine's model name ("AMD EPYC") hides them.
KERNEL_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "avx2", "fma", "avx")


def cpu_kernels() -> str:
    """The kernels a run picks on this CPU: torch's CPU capability (``AVX512``, ``AVX2``,
    ``DEFAULT``; ``ATEN_CPU_CAPABILITY`` moves it) and the CPU's :data:`KERNEL_FLAGS`, e.g.
    ``AVX2 [avx2 fma avx]``. Two machines of one model name that differ here run the same
    commit and seed to other numbers (issue 74; issue 73's anchor cells, 2026-12-01)."""
    import torch

    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    have = " ".join(f for f in KERNEL_FLAGS if f in flags)
    return f"{torch.backends.cpu.get_cpu_capability()} [{have}]"


def machine_state(device: str = "auto") -> dict[str, Any]:
    """What this machine is, for a cell's record: a hash of the host name (not the name),
    CPU model, the kernels it picks (:func:`cpu_kernels`), core count, torch and CUDA
    versions and the torch device ``device`` resolves to here (with the GPU's name where it
    is one)."""
    import torch

    from fedowen_task.device import resolve

    used = resolve(device)
    gpu = torch.cuda.get_device_name(used) if used.type == "cuda" else None
    return {"host": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
            "cpu": cpu_model(), "kernels": cpu_kernels(), "cores": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "device": str(used),
            "gpu": gpu}


def machine_key(machine: dict[str, Any]) -> str:
    """One machine in words: ``host 1a2b3c4d5e6f, cuda (NVIDIA H200)`` or ``..., cpu``, and
    the CPU's kernels where the record has them (records before 2026-12-01 do not: their CPU
    kind is unknown, and they read as before)."""
    gpu = f" ({machine['gpu']})" if machine.get("gpu") else ""
    kernels = f", {machine['kernels']}" if machine.get("kernels") else ""
    return f"host {machine.get('host')}, {machine.get('device')}{gpu}{kernels}"


def record_machine(out: Path, machine: dict[str, Any]) -> None:
    """Add ``machine`` to the last attempt of ``out/code.json``."""
    path = out / CODE_FILE
    attempts = json.loads(path.read_text()) if path.exists() else []
    if attempts:
        attempts[-1]["machine"] = machine
        path.write_text(json.dumps(attempts, indent=1) + "\n")


def note_machine(out: Path, device: str) -> None:
    """Record in ``out/code.json`` the machine the cell's last attempt ran on: the node's own
    record where the cell ran elsewhere (``machine.json``, a Ray worker's), else this one."""
    elsewhere = out / MACHINE_FILE
    if elsewhere.exists():
        machine = json.loads(elsewhere.read_text())
        elsewhere.unlink()
    else:
        machine = machine_state(device)
    record_machine(out, machine)


def mixed_machines(results: Path, settings: dict[str, list[str]]) -> dict[str, set[str]]:
    """The settings (``{label: [cell id]}``) whose recorded cells ran on more than one
    machine (:func:`machine_key`), with those machines; cells without a record are skipped."""
    mixed = {}
    for label, cell_ids in settings.items():
        seen = {machine_key(m) for cid in cell_ids for m in cell_machines(results / cid)}
        if len(seen) > 1:
            mixed[label] = seen
    return mixed


def cell_machines(out: Path) -> list[dict[str, Any]]:
    """The machines a cell's attempts ran on, as ``code.json`` says (none in records written
    before issue 60: they read as before)."""
    path = out / CODE_FILE
    attempts = json.loads(path.read_text()) if path.exists() else []
    return [a["machine"] for a in attempts if isinstance(a.get("machine"), dict)]


def recorded_defaults(out: Path) -> str | None:
    """The defaults' hash the cell's last attempt ran under (None: a record without one)."""
    path = out / CODE_FILE
    attempts = json.loads(path.read_text()) if path.exists() else []
    return attempts[-1].get("defaults") if attempts else None


def cell_status(results: Path, cell_id: str, events: list[dict[str, Any]]) -> str:
    """``done``, ``failed`` (retry exhausted), ``partial`` (checkpoint, no summary) or
    ``pending``."""
    out = results / cell_id
    if (out / SUMMARY_FILE).exists():
        return "done"
    if events and events[-1].get("event") == "failed":
        return "failed"
    if (out / CHECKPOINT).exists():
        return "partial"
    return "pending"
