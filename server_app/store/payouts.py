"""The payout ledger's files: a run dir's ledger from its ``rounds.jsonl`` and
``adversaries.json``, written to ``payouts.csv`` (the computation:
:mod:`fedowen_strategy.payouts`)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

from fedowen_strategy.payouts import Payout, client_values, linked_clients, payouts
from fedowen_strategy.round.round_valuers import NO_PHI
from server_app.store.records import read_rounds

PAYOUTS_FILE = "payouts.csv"
ADVERSARIES_FILE = "adversaries.json"


def recorded_adversaries(run_dir: str | Path) -> list[str] | None:
    """The adversaries' client ids the ServerApp recorded (``adversaries.json``), else None."""
    path = Path(run_dir) / ADVERSARIES_FILE
    if not path.exists():
        return None
    return [str(i) for i in json.loads(path.read_text())["ids"]]


def run_payouts(run_dir: str | Path, field: str = "phi",
                adversaries: Iterable[str] | None = None) -> list[Payout]:
    """The ledger of a run dir (adversaries from its ``adversaries.json`` unless given).

    Raises
    ------
    ValueError
        When ``rounds.jsonl`` records no ``field`` (a strategy that values nobody).
    """
    rounds = [r for r in read_rounds(run_dir) if r.get("round", 0) > 0]
    values, selected = client_values(rounds, field)
    placeholder = rounds and all(r.get("valuation") in NO_PHI for r in rounds)
    if placeholder or not any(values.values()):
        raise ValueError(f"{Path(run_dir) / 'rounds.jsonl'} records no {field!r} in any of its "
                         f"{len(rounds)} rounds (valuation none and multikrum record "
                         "placeholders): the ledger needs a strategy that values clients "
                         "(FedOwen with a valuation method)")
    if adversaries is None:
        adversaries = recorded_adversaries(run_dir)
    return payouts(values, selected, adversaries, forfeited=linked_clients(rounds))


def write_payouts(rows: Sequence[Payout], path: str | Path) -> Path:
    """The ledger as CSV (one row per client, by rank)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(Payout.__dataclass_fields__)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        for row in rows:
            line = asdict(row)
            writer.writerow({k: ("" if v is None else round(v, 6) if isinstance(v, float)
                                 else v) for k, v in line.items()})
    return path
