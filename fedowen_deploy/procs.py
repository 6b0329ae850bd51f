"""Stop every process we started, also those Flower and Ray detach, also on SIGTERM/SIGINT.

The SuperLink starts a SuperExec in its own session, the SuperExec starts ``flwr-simulation``
(or ``flwr-serverapp``), which starts Ray's ``gcs_server``, ``raylet`` and workers. Killing
the SuperLink's process group reaches none of them, and once a parent is gone its children
are re-parented to init and can no longer be found. :func:`stop_tree` therefore collects the
whole tree from ``/proc`` *before* signalling, signals every pid in it, and SIGKILLs what is
left after a grace period.

A Python CLI killed by SIGTERM runs no ``finally`` block and no context-manager exit;
:func:`exit_on_signals` turns SIGTERM, SIGINT and SIGHUP into ``SystemExit``, so
``kill <pid>`` of ``scripts/run.sh`` stops its SuperLink and everything beneath it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any


def descendants(pid: int) -> list[int]:
    """Pids of all live descendants of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(c) for c in children.read_text().split()]
            except OSError:
                continue
            found.extend(kids)
            stack.extend(kids)
    return found


def send_signal(pid: int, sig: signal.Signals) -> None:
    """``os.kill`` (a negative pid: a process group) that ignores processes already gone."""
    try:
        if pid < 0:
            os.killpg(-pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_tree(process: subprocess.Popen[bytes] | subprocess.Popen[str],
              grace: float = 10.0) -> None:
    """SIGTERM ``process`` (a session leader: its whole group) and every descendant; SIGKILL
    whatever still runs after ``grace`` seconds."""
    tree = set(descendants(process.pid))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        send_signal(-process.pid, sig)
        for pid in list(tree):
            if alive(pid):
                tree.update(descendants(pid))  # spawned since the last look
        for pid in tree:
            send_signal(pid, sig)
        deadline = time.monotonic() + grace
        while process.poll() is None or any(map(alive, tree)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        else:
            return
    process.wait(timeout=grace)


def follow(process: subprocess.Popen[str], stream_to: Any,
           timeout: float) -> tuple[list[str], bool]:
    """Read the process's output lines (copied to ``stream_to``) until it closes them or
    ``timeout`` seconds have passed; returns the lines and whether time ran out."""
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    for line in process.stdout:
        lines.append(line)
        if stream_to is not None:
            stream_to.write(line)
            stream_to.flush()
        if time.monotonic() > deadline:
            return lines, True
    return lines, False


class Terminated(SystemExit):
    """Raised in the main thread when SIGTERM, SIGINT or SIGHUP arrives (status 128 + n)."""


SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextmanager
def exit_on_signals() -> Iterator[None]:
    """Turn the first SIGTERM, SIGINT or SIGHUP into :class:`Terminated` while the block runs,
    so ``with``-managed processes are stopped; later signals are ignored until the block has
    exited, so a second Ctrl-C cannot cut the cleanup short (SIGKILL still can)."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        # A Python no-op, not SIG_IGN: an ignored disposition survives exec, so children
        # started during the cleanup (a runner's next cell) would be deaf to SIGTERM.
        for sig in SIGNALS:
            signal.signal(sig, _ignore)
        stop_tracked()
        raise Terminated(128 + signum)

    saved = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """Swallow a repeated signal while the cleanup runs."""


_TRACKED: set[subprocess.Popen[str]] = set()
_TRACK_LOCK = threading.Lock()
_STOPPING = threading.Event()


@contextmanager
def tracked(process: subprocess.Popen[str], grace: float = 5.0) -> Iterator[None]:
    """Register a child that worker threads wait on, so a signal in the main thread can stop it
    (:func:`stop_tracked`); a child started after that is stopped at once."""
    with _TRACK_LOCK:
        _TRACKED.add(process)
    if _STOPPING.is_set():
        stop_tree(process, grace=grace)
    try:
        yield
    finally:
        with _TRACK_LOCK:
            _TRACKED.discard(process)


def stopping() -> bool:
    """Whether :func:`stop_tracked` has been called: a runner starts and retries nothing more,
    and a cell that ends now was stopped by us, not failed."""
    return _STOPPING.is_set()


def stop_tracked(grace: float = 5.0) -> None:
    """Stop every :func:`tracked` child (and any tracked later), e.g. the cells that a
    runner's worker threads are following when SIGTERM arrives."""
    _STOPPING.set()
    with _TRACK_LOCK:
        running = list(_TRACKED)
    for proc in running:
        stop_tree(proc, grace=grace)
