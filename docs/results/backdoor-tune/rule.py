"""backdoor-tune's rule (conf/backdoor-tune.toml, steps 1-3) on its 96 cells: 89 finished and 7
stopped by the app's stall rule, those scored at their last recorded round (the preset's
clause: last accuracies and attack success carried to round 50). Validation decides.

    python rule.py RESULTS attack-success-cells.csv
"""

import csv
import json
import statistics
import sys
from pathlib import Path

RESULTS, CELLS = Path(sys.argv[1]), sys.argv[2]
STALLED = {
    "00c20d5c6434": ("backdoor", "indicator-0.05", 0),
    "e9feedb55f13": ("clean", "indicator-0.05", 0),
    "a24bf936d792": ("clean", "indicator-0.05", 1),
    "7e1989b7418d": ("clean", "indicator-0.02", 1),
    "c2e2dc2734c1": ("backdoor", "indicator-0.05", 2),
    "b1856c3857d9": ("backdoor", "indicator-0.02", 2),
    "052a0b1b8b4e": ("clean", "indicator-0.05", 2),
}
FAMILIES = {
    "alignins": ["alignins-1", "alignins-1.5", "alignins-2"],
    "multi-metrics": ["multi-metrics-0.3", "multi-metrics-0.5", "multi-metrics-0.7"],
    "indicator": ["indicator-0.05", "indicator-0.02"],
    "spread": ["spread-1", "spread-2", "spread-4"],
    "exclusion": ["exclusion-0.05", "exclusion-0.2"],
    "flame": ["flame"],
    "posterior": ["posterior"],
}
score = {}
with open(CELLS) as fh:
    for r in csv.DictReader(fh):
        asr = float(r["asr"]) if r["asr"] else None
        score[(r["grid"], r["arm"], int(r["seed"]))] = (asr, float(r["val"]))
for cell, key in STALLED.items():
    with open(RESULTS / cell / "rounds.jsonl") as fh:
        last = [json.loads(line) for line in fh][-1]
    asr = last.get("attack_success")
    score[key] = (None if asr is None else 100 * asr, 100 * last["val_accuracy"])
assert len(score) == 96, len(score)


def stats(arm, seeds):
    """(mean paired clean cost in val points, mean ASR) over ``seeds``."""
    cost = statistics.mean(score[("clean", arm, s)][1] - score[("clean", "fedowen", s)][1]
                           for s in seeds)
    return cost, statistics.mean(score[("backdoor", arm, s)][0] for s in seeds)


def pick(family, seeds):
    """Step 2: the lowest mean ASR within -2 points (ties: smaller cost, then listed first);
    none within: the smallest cost, failing."""
    arms = FAMILIES[family]
    st = {a: stats(a, seeds) for a in arms}
    ok = [a for a in arms if st[a][0] >= -2]
    if ok:
        return min(ok, key=lambda a: (round(st[a][1], 1), -st[a][0], arms.index(a))), True, st
    return max(arms, key=lambda a: st[a][0]), False, st


print("| family | setting | clean cost (val, mean over seeds 0-2) | mean ASR | picked "
      "| without seed 0 / 1 / 2 |")
print("|---|---|---:|---:|---|---|")
print(f"| reference | fedowen | 0.00 | {stats('fedowen', [0, 1, 2])[1]:.1f} | | |")
for family, arms in FAMILIES.items():
    chosen, held, st = pick(family, [0, 1, 2])
    loo = [pick(family, [s for s in (0, 1, 2) if s != out])[0] for out in (0, 1, 2)]
    for a in arms:
        mark = ""
        if a == chosen:
            mark = ("goes on (one setting)" if len(arms) == 1
                    else "**yes**" if held else "**yes, failing the cost**")
        without = " / ".join(loo) if a == chosen else ""
        print(f"| {family} | {a} | {st[a][0]:+.2f} | {st[a][1]:.1f} | {mark} | {without} |")
