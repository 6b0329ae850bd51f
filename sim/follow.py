"""What the runner reads of a cell while and after it runs: each new round as the cell's
``rounds.jsonl`` grows (the runner's progress lines) and the last lines of its log (kept with
a failed attempt in ``cells.jsonl``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from server_app.store.records import read_rounds


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of the log at ``path`` (empty when there is none)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def watch_rounds(path: Path, on_round: Callable[[dict[str, Any]], None],
                  interval: float = 2.0) -> Iterator[None]:
    """Call ``on_round`` for each line appended to ``rounds.jsonl`` while the block runs."""
    stop = threading.Event()
    seen = len(read_rounds(path.parent)) if path.exists() else 0

    def poll() -> None:
        nonlocal seen
        while True:
            done = stop.wait(interval)
            try:
                rounds = read_rounds(path.parent)
            except (OSError, json.JSONDecodeError):  # a line being written
                rounds = []
            for record in rounds[seen:]:
                on_round(record)
            seen = max(seen, len(rounds))
            if done:
                return

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
