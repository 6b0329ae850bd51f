"""Per-round records of a run: JSON lines and a contribution ledger (CSV).

``rounds.jsonl`` gets one line per round once the round's central evaluation is in (the
strategy's training record merged with the server's test metrics); ``ledger.csv`` one row per
(client, round) valuation. Every line is flushed when written, so a crash loses nothing that
was already recorded.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
ROUNDS_FILE = "rounds.jsonl"
LEDGER_FILE = "ledger.csv"
LEDGER_FIELDS = ("client_id", "round", "phi", "phi_raw", "weight", "num_examples")


def _jsonable(value: Any) -> Any:
    """Plain JSON: numpy scalars to Python, non-finite floats to None."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunRecorder:
    """Append-only writer of a run's ``rounds.jsonl`` and ``ledger.csv``.

    Parameters
    ----------
    output_dir : Path
        Created if missing. Existing files are appended to (a resumed run continues them).
    """

    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._pending: dict[int, dict[str, Any]] = {}
        ledger = self.output_dir / LEDGER_FILE
        if not ledger.exists():
            with ledger.open("w", newline="") as fh:
                csv.writer(fh).writerow(LEDGER_FIELDS)

    def log_train(self, server_round: int, record: dict[str, Any],
                  ledger_rows: list[dict[str, Any]]) -> None:
        """Keep the round's training record until its evaluation arrives; write ledger rows."""
        self._pending.setdefault(server_round, {}).update(record)
        with (self.output_dir / LEDGER_FILE).open("a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=LEDGER_FIELDS)
            for row in ledger_rows:
                writer.writerow({k: _jsonable(row.get(k)) for k in LEDGER_FIELDS})

    def log_eval(self, server_round: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Merge the round's evaluation into its record and append it to ``rounds.jsonl``."""
        line = {"round": server_round, **self._pending.pop(server_round, {}), **metrics}
        with (self.output_dir / ROUNDS_FILE).open("a") as fh:
            fh.write(json.dumps(_jsonable(line)) + "\n")
        return line

    def truncate_after(self, server_round: int) -> None:
        """Drop records of rounds after ``server_round`` (a resumed run redoes them)."""
        rounds = [r for r in read_rounds(self.output_dir) if r["round"] <= server_round]
        _atomic_write(self.output_dir / ROUNDS_FILE,
                      "".join(json.dumps(r) + "\n" for r in rounds))
        with (self.output_dir / LEDGER_FILE).open(newline="") as fh:
            rows = [row for row in csv.DictReader(fh) if _round_of(row) <= server_round]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=LEDGER_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
        _atomic_write(self.output_dir / LEDGER_FILE, buf.getvalue())

    def write_json(self, name: str, payload: dict[str, Any]) -> Path:
        """Write ``payload`` as ``name`` (e.g. the run's settings or summary) atomically:
        ``summary.json`` is the runner's "done" marker, so it is never seen half written."""
        path = self.output_dir / name
        _atomic_write(path, json.dumps(_jsonable(payload), indent=2) + "\n")
        return path


def _round_of(row: dict[str, Any]) -> float:
    """A ledger row's round; a torn row (a crash mid-write) counts as never written."""
    try:
        return int(row["round"]) if row.get(LEDGER_FIELDS[-1]) is not None else math.inf
    except (TypeError, ValueError):
        return math.inf


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then move it into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_rounds(output_dir: str | Path) -> list[dict[str, Any]]:
    """All round records of a run, in file order.

    A torn last line (a crash while it was written) is dropped with a warning: that round had
    not finished, and a resumed run redoes it. Any other unreadable line is an error.

    Raises
    ------
    ValueError
        A line before the last is not JSON (the file was edited or damaged).
    """
    path = Path(output_dir) / ROUNDS_FILE
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rounds = []
    for number, line in enumerate(lines, start=1):
        try:
            rounds.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):
                log.warning("%s: dropped a torn last line (%d bytes): that round did not "
                            "finish", path, len(line))
                break
            raise ValueError(f"{path} line {number} is not JSON ({err}): the file was edited "
                             "or damaged; restore it or start the run afresh") from err
    return rounds
