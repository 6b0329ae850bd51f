"""Per-round rows of the smoke runs, read from each run's records (``rounds.jsonl``,
``adversaries.json``): ``python docs/results/backdoor-indicator-smoke/summarise.py OUT CSV_GZ``.

Columns: arm, round, test accuracy, attack success, attackers selected, attackers and honest
clients rejected; for the indicator arm also the planting's strongest label accuracy before and
after and that label, the mean over labels after, the planting's norm, and the mean strongest
indicator accuracy of the attackers' and of the honest clients' updates.
"""

from __future__ import annotations

import csv
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ARMS = ("defaults", "indicator")
COLUMNS = ("arm", "round", "test_accuracy", "attack_success", "attackers_selected",
           "attackers_rejected", "honest_rejected", "planted_before", "planted", "planted_label",
           "planted_mean", "planting_norm", "attacker_indicator", "honest_indicator")


def mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f}" if values else ""


def rows(run: Path, arm: str) -> list[dict[str, Any]]:
    """One row per round of the run in ``run``."""
    attackers = set(json.loads((run / "adversaries.json").read_text())["ids"])
    merged: dict[int, dict[str, Any]] = defaultdict(dict)
    for line in (run / "rounds.jsonl").read_text().splitlines():
        entry = json.loads(line)
        merged[entry["round"]].update(entry)
    out = []
    for rnd, entry in sorted(merged.items()):
        selected, rejected = entry.get("selected", []), entry.get("rejected", {})
        row: dict[str, Any] = {
            "arm": arm, "round": rnd, "test_accuracy": f"{entry['test_accuracy']:.3f}",
            "attack_success": f"{entry['attack_success']:.3f}",
            "attackers_selected": sum(c in attackers for c in selected),
            "attackers_rejected": sum(c in attackers for c in rejected),
            "honest_rejected": sum(c not in attackers for c in rejected)}
        if (ind := entry.get("indicator")) is not None:
            acc = ind["accuracy"]
            row.update({
                "planted_before": f"{ind['before']:.3f}", "planted": f"{ind['planted']:.3f}",
                "planted_label": ind["label"], "planted_mean": f"{ind['planted_mean']:.3f}",
                "planting_norm": f"{ind['norm']:.3f}",
                "attacker_indicator": mean([a for c, a in acc.items() if c in attackers]),
                "honest_indicator": mean([a for c, a in acc.items() if c not in attackers])})
        out.append(row)
    return out


def main(out: Path, target: Path) -> None:
    with gzip.open(target, "wt", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        for arm in ARMS:
            writer.writerows(rows(out / arm, arm))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
