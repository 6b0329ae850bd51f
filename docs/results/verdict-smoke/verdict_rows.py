"""One row per finished cell of conf/verdict-smoke.toml, read from its records (issue 72,
deliver 4): attack success (max of the last 5 rounds), accuracy (mean of the last 5), the
attackers' turns, their mean weight and mean phi per returned update beside an honest client's,
and, for the exclusion arm, who was excluded by the end (attackers, honest clients) and when.

    PYTHONPATH=. python docs/results/verdict-smoke/verdict_rows.py RESULTS OUT_CSV
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from sim.presets import load_preset
from sim.results import LAST_K, CellResult, load_results
from studies.adversarial.adversary_stats import cell_adversaries
from studies.backdoor.attack_success import asr_curve

PRESET = Path(__file__).resolve().parents[3] / "conf" / "verdict-smoke.toml"
NUM_PARTITIONS = 100


def mean(xs: list[float]) -> float:
    return float(np.mean(xs)) if xs else math.nan


def cell_row(r: CellResult) -> dict[str, Any]:
    """The row of one finished cell (module docstring)."""
    adv = cell_adversaries(r, NUM_PARTITIONS)
    weight: dict[bool, list[float]] = {True: [], False: []}
    phi: dict[bool, list[float]] = {True: [], False: []}
    excluded: list[str] = []
    for rec in r.rounds:
        for cid, w in (rec.get("weights") or {}).items():
            weight[cid in adv].append(float(w))
            phi[cid in adv].append(float(rec["phi"][cid]))
        excluded = (rec.get("selection") or {}).get("excluded", excluded)
    rounds, asr = asr_curve(r)
    hit = bool(adv)
    return {
        "arm": str(r.cell.point.get("variant")), "seed": r.cell.config.seed,
        "attack": "backdoor" if hit else "none",
        "asr_max_last5": round(float(asr[rounds > 0][-LAST_K:].max()), 2) if hit else "",
        "test_last5": round(r.last_k_accuracy() or math.nan, 2),
        "val_last5": round(r.last_k_accuracy(key="val_accuracy") or math.nan, 2),
        "attacker_turns": len(weight[True]), "honest_turns": len(weight[False]),
        "weight_ratio": round(mean(weight[True]) / mean(weight[False]), 3) if hit else "",
        "attacker_mean_phi": round(mean(phi[True]), 4) if hit else "",
        "honest_mean_phi": round(mean(phi[False]), 4),
        "excluded_attackers": sum(c in adv for c in excluded),
        "excluded_honest": sum(c not in adv for c in excluded),
        "cell": r.cell.cell_id}


def main(results: Path, out: Path) -> None:
    rows = sorted((cell_row(r) for r in load_results(load_preset(PRESET), results).values()
                   if r.finished), key=lambda x: (x["attack"], x["arm"], x["seed"]))
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(row)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
