"""What the selection studies read off one finished cell, shared by the development grids'
rules (:mod:`.development` for selection-dev, :mod:`.peers` for selection-peers-dev).

A cell's scores are the validation and test accuracy (%) averaged over its last
:data:`sim.results.LAST_K` rounds (rounds 96-100 of 100); its selection is summarised by the
share of the federation's clients it ever selected and its most selected client's count.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.grid import Cell
from sim.results import LAST_K, CellResult
from studies.adversarial.attack_costs import attacked

VAL, TEST = "val_accuracy", "test_accuracy"


def selections(result: CellResult) -> Counter[Any]:
    """How many training rounds selected each client over the run."""
    return Counter(c for r in result.rounds if r.get("round", 0) > 0
                   for c in r.get("selected", []))


def distinct_share(result: CellResult, clients: int) -> float:
    """Share of the federation's clients selected at least once over the run."""
    return len(selections(result)) / clients


def top_share(result: CellResult, clients: int) -> float:
    """How often the most selected client was selected over the run, in units of the mean
    count (uniform draws give about 2 over 100 rounds of 10 from 100: the maximum of 100
    binomials; an identity cap c keeps it near c at most)."""
    counts = selections(result)
    total = sum(counts.values())
    return max(counts.values()) * clients / total if total else math.nan


def cell_scores(result: CellResult) -> dict[str, float]:
    """A finished cell's ``{VAL: ..., TEST: ...}``, each the mean (%) of its last
    :data:`~sim.results.LAST_K` rounds; a metric the cell did not record is left out."""
    out = {}
    for metric in (VAL, TEST):
        value = result.last_k_accuracy(LAST_K, key=metric)
        if value is not None:
            out[metric] = value
    return out


def setting_key(cell: Cell) -> str:
    """The setting a cell belongs to: its dataset and alpha (FEMNIST: its dataset), attacked
    or clean."""
    cfg = cell.config
    name = cfg.dataset if cfg.dataset == "femnist" else f"{cfg.dataset} alpha={cfg.alpha:g}"
    return f"{name}, attacked" if attacked(cell.run_config) else name


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` as a CSV with the first row's keys as its header, floats to 4 decimals."""
    with path.open("w", newline="") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            for row in rows:
                writer.writerow({k: f"{v:.4f}" if isinstance(v, float) else v
                                 for k, v in row.items()})


#: A round's costs as :func:`round_cost` reads them, in report order.
COSTS = ("n_evals", "valuation_seconds", "selector_seconds", "extra_messages", "round_seconds")


def round_cost(record: dict[str, Any]) -> dict[str, float | None]:
    """One round's costs, None where its record does not carry one: the valuation's game
    evaluations and seconds; the selector's own seconds (``selection.selector_seconds``,
    which every selector's record carries since the shared selection measures it; records
    made before: ``selection.server_seconds``, or GreedyFed's ``choose_seconds`` +
    ``observe_seconds``) and its extra messages (``selection.extra_messages``; before:
    Power-of-Choice's ``query_messages``); the round's wall seconds."""
    sel = record.get("selection")
    sel = sel if isinstance(sel, dict) else {}
    seconds = sel.get("selector_seconds", sel.get("server_seconds"))
    if seconds is None and "choose_seconds" in sel:
        seconds = sel["choose_seconds"] + sel.get("observe_seconds", 0.0)
    messages = sel.get("extra_messages", sel.get("query_messages"))
    out = {"n_evals": record.get("n_evals"), "valuation_seconds": record.get("valuation_seconds"),
           "selector_seconds": seconds, "extra_messages": messages,
           "round_seconds": record.get("round_seconds")}
    return {k: None if v is None else float(v) for k, v in out.items()}


def round_costs(result: CellResult) -> dict[str, float | None]:
    """Each of :data:`COSTS` averaged over the training rounds whose records carry it (None
    where none does)."""
    costs = [round_cost(r) for r in result.rounds if r.get("round", 0) > 0]
    out: dict[str, float | None] = {}
    for key in COSTS:
        values = [v for c in costs if (v := c[key]) is not None]
        out[key] = sum(values) / len(values) if values else None
    return out
