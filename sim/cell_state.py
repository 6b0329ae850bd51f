"""The files that hold a results folder's state: ``cells.jsonl`` (attempts and failures, one
event per line), each cell's ``summary.json`` (done), ``checkpoint.npz`` (resumable) and
``code.json`` (the code every attempt ran). :mod:`sim.runner` writes them; reports, archives
and carry read them.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

STATE_FILE = "cells.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT = "checkpoint.npz"
CODE_FILE = "code.json"
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
    """Append this attempt's :func:`code_state` to ``out/code.json``."""
    path = out / CODE_FILE
    attempts = json.loads(path.read_text()) if path.exists() else []
    attempts.append({"attempt": attempt, "resumed": resumed,
                     "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **code_state()})
    path.write_text(json.dumps(attempts, indent=1) + "\n")


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
