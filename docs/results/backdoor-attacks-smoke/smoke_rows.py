"""The backdoor attacks' smoke runs read from their records (issue 72, deliver 3).

    python docs/results/backdoor-attacks-smoke/smoke_rows.py RUNS OUT

RUNS holds one run directory per arm (rounds.jsonl, adversaries.json); OUT gets
smoke-rounds.csv.gz (a row per arm and round) and prints the summary table's rows.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from statistics import mean
from typing import Any

from sim.compact import open_csv

ARMS = ("clean", "backdoor-bars", "dba", "backdoor", "neurotoxin", "adaptive-backdoor")
COLUMNS = ("arm", "round", "test_accuracy", "attack_success", "attackers_selected",
           "attackers_capped", "rejected", "attacker_weight", "honest_weight", "links",
           "least_cosine", "cosines_before", "cosines_after", "attackers_max_cosine",
           "sent_norms")


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return " ".join(_fmt(v) for v in value)
    return str(value)


def rows_of(arm: str, run: Path) -> list[dict[str, Any]]:
    """One row per round of ``run``'s records."""
    bad = set(json.loads((run / "adversaries.json").read_text())["ids"]) \
        if (run / "adversaries.json").exists() else set()
    merged: dict[int, dict[str, Any]] = {}
    for line in (run / "rounds.jsonl").read_text().splitlines():
        rec = json.loads(line)
        merged.setdefault(rec["round"], {}).update(rec)
    out = []
    for rnd, rec in sorted(merged.items()):
        weights = rec.get("weights", {})
        attack = rec.get("attack", {})
        att = [w for c, w in weights.items() if c in bad]
        hon = [w for c, w in weights.items() if c not in bad]
        out.append({
            "arm": arm, "round": rnd, "test_accuracy": rec.get("test_accuracy"),
            "attack_success": rec.get("attack_success"),
            "attackers_selected": len([c for c in rec.get("selected", []) if c in bad]),
            "attackers_capped": len([c for c in rec.get("capped", {}) if c in bad]),
            "rejected": len(rec.get("rejected", {})),
            "attacker_weight": mean(att) if att else None,
            "honest_weight": mean(hon) if hon else None,
            "links": len(rec.get("links", [])),
            "least_cosine": attack.get("least_cosine"),
            "cosines_before": attack.get("cosines_before"),
            "cosines_after": attack.get("cosines_after"),
            "attackers_max_cosine": attack.get("attackers_max_cosine"),
            "sent_norms": attack.get("norms"),
        })
    return out


def main(argv: list[str]) -> int:
    runs, out = Path(argv[0]), Path(argv[1])
    rows = [row for arm in ARMS if (runs / arm / "rounds.jsonl").exists()
            for row in rows_of(arm, runs / arm)]
    out.mkdir(parents=True, exist_ok=True)
    with open_csv(out / "smoke-rounds.csv.gz", "w") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows([_fmt(row[c]) for c in COLUMNS] for row in rows)
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        asr = [r["attack_success"] for r in mine if r["attack_success"] is not None]
        last5 = f"{100 * max(asr[-5:]):.1f}" if asr else "-"
        print(f"| `{arm}` | {100 * mine[-1]['test_accuracy']:.1f} | {last5} | "
              f"{sum(r['attackers_selected'] for r in mine)} | "
              f"{sum(r['attackers_capped'] for r in mine)} | {sum(r['rejected'] for r in mine)} | "
              f"{sum(r['links'] for r in mine)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
