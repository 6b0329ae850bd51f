"""backdoor-tune's rule (conf/backdoor-tune.toml, steps 1-3) on its 96 cells: 89 finished and 7
stopped by the app's stall rule, those scored at their last recorded round (the preset's
clause: last accuracies and attack success carried to round 50). Validation decides."""
import csv, json, statistics, sys
from pathlib import Path
res, cells_csv = Path(sys.argv[1]), sys.argv[2]
score = {}
for r in csv.DictReader(open(cells_csv)):
    score[(r["grid"], r["arm"], int(r["seed"]))] = (float(r["asr"]) if r["asr"] else None, float(r["val"]))
STALLED = {"00c20d5c6434": ("backdoor", "indicator-0.05", 0), "e9feedb55f13": ("clean", "indicator-0.05", 0),
           "a24bf936d792": ("clean", "indicator-0.05", 1), "7e1989b7418d": ("clean", "indicator-0.02", 1),
           "c2e2dc2734c1": ("backdoor", "indicator-0.05", 2), "b1856c3857d9": ("backdoor", "indicator-0.02", 2),
           "052a0b1b8b4e": ("clean", "indicator-0.05", 2)}
for c, key in STALLED.items():
    last = [json.loads(l) for l in open(res / c / "rounds.jsonl")][-1]
    asr = last.get("attack_success")
    score[key] = (None if asr is None else 100 * asr, 100 * last["val_accuracy"])
FAMILIES = {"alignins": ["alignins-1", "alignins-1.5", "alignins-2"],
            "multi-metrics": ["multi-metrics-0.3", "multi-metrics-0.5", "multi-metrics-0.7"],
            "indicator": ["indicator-0.05", "indicator-0.02"],
            "spread": ["spread-1", "spread-2", "spread-4"],
            "exclusion": ["exclusion-0.05", "exclusion-0.2"], "flame": ["flame"], "posterior": ["posterior"]}
def stats(arm, seeds):
    cost = statistics.mean(score[("clean", arm, s)][1] - score[("clean", "fedowen", s)][1] for s in seeds)
    asr = statistics.mean(score[("backdoor", arm, s)][0] for s in seeds)
    return cost, asr
def pick(fam, seeds):
    arms = FAMILIES[fam]
    st = {a: stats(a, seeds) for a in arms}
    ok = [a for a in arms if st[a][0] >= -2]
    if ok:
        return min(ok, key=lambda a: (round(st[a][1], 1), -st[a][0], arms.index(a))), True, st
    return max(arms, key=lambda a: st[a][0]), False, st
assert len(score) == 96, len(score)
print("| family | setting | clean cost (val, mean over seeds 0-2) | mean ASR | picked | without seed 0 / 1 / 2 |")
print("|---|---|---:|---:|---|---|")
print(f"| reference | fedowen | 0.00 | {stats('fedowen', [0,1,2])[1]:.1f} | | |")
for fam in FAMILIES:
    p, held, st = pick(fam, [0, 1, 2])
    loo = [pick(fam, [s for s in (0, 1, 2) if s != out])[0] for out in (0, 1, 2)]
    for a in FAMILIES[fam]:
        mark = ("goes on (one setting)" if len(FAMILIES[fam]) == 1 else "**yes**" if held
                else "**yes, failing the cost**") if a == p else ""
        l = " / ".join(loo) if a == p else ""
        print(f"| {fam} | {a} | {st[a][0]:+.2f} | {st[a][1]:.1f} | {mark} | {l} |")
