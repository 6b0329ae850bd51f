"""The smoke runs' per-round rows (smoke-rounds.csv.gz's columns), from each arm's rounds.jsonl
and adversaries.json: attackers among the selected, attackers and honest clients rejected.

Usage, from the repository root: python docs/results/backdoor-peers-smoke/rows.py OUT ARM...
(OUT the folder run_all.sh wrote; prints CSV on stdout).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = ("arm", "round", "test_accuracy", "attack_success", "attackers_selected",
           "attackers_rejected", "honest_rejected")


def rows(out: Path, arm: str) -> list[str]:
    """One line per round of ``arm``'s run under ``out``."""
    attackers = set(json.loads((out / arm / "adversaries.json").read_text())["ids"])
    lines = []
    for line in (out / arm / "rounds.jsonl").read_text().splitlines():
        rec = json.loads(line)
        selected = set(rec.get("selected", []))
        rejected = set(rec.get("rejected", {}))
        lines.append(f"{arm},{rec['round']},{rec['test_accuracy']:.3f},"
                     f"{rec.get('attack_success', 0.0):.3f},{len(selected & attackers)},"
                     f"{len(rejected & attackers)},{len(rejected - attackers)}")
    return lines


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    print(",".join(COLUMNS))
    for name in sys.argv[2:]:
        print("\n".join(rows(folder, name)))
