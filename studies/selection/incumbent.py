"""A challenger against the incumbent default, paired by seed (issue 73): the evidence the
incumbent rule reads. A default changes only when the challenger beats the incumbent beyond
the paired 95% CI in a pre-registered comparison; on a tie the incumbent stays.

Written for selection-peers-dev's fallback, ``hics-phi`` against Algorithm 2 (selection-dev's
``fedowen`` arm, which selection-peers-dev reuses): per setting the mean of the paired val
differences (mean of rounds 96-100) with its 95% t-interval, the paired t-test's p and how many
pairs favour the challenger; then over every setting-seed pair; then over the seed means,
each seed's difference averaged over the settings (the pairing of the rule's mean over the
settings), and those again with each seed, then each setting, left out. Everything is read
from the committed archives in place, nothing restored, nothing run:

    python -m studies.selection.incumbent conf/selection-peers-dev.toml \\
        --results archives/selection-peers-dev --reference-results archives/selection-dev \\
        --out docs/results/selection-peers-dev/hics-phi-vs-algorithm2.csv
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from sim.presets import load_preset
from sim.stats import mean_interval
from studies.selection.cells import VAL, write_csv
from studies.selection.peers_data import collect, group, reference_results, set_aside

#: ``{setting: {seed: val}}``, one arm's scores.
Scores = Mapping[str, Mapping[int, float]]


def row(label: str, diffs: list[float]) -> dict[str, Any]:
    """One line of the table: the differences' count, mean, 95% t-interval, paired t-test p
    and how many are above 0 (a difference of exactly 0 favours neither)."""
    interval = mean_interval(diffs)
    p = (float(stats.ttest_1samp(diffs, 0.0).pvalue)
         if len(diffs) > 1 and np.ptp(diffs) > 0 else math.nan)
    return {"comparison": label, "pairs": len(diffs), "mean_diff": interval.mean,
            "ci_low": interval.lo, "ci_high": interval.hi, "p_t": p,
            "favouring": sum(d > 0 for d in diffs)}


def paired_rows(challenger: Scores, incumbent: Scores) -> list[dict[str, Any]]:
    """Challenger minus incumbent: a row per setting (its seeds), one over every setting-seed
    pair, one over the seed means (each seed's differences averaged over the settings; only
    seeds every setting has), and the seed means again with each seed, then each setting, left
    out in turn."""
    diffs = {name: {s: challenger[name][s] - incumbent[name][s]
                    for s in sorted(set(challenger[name]) & set(incumbent[name]))}
             for name in challenger}
    rows = [row(name, list(d.values())) for name, d in diffs.items()]
    rows.append(row("all (setting-seed pairs)", [v for d in diffs.values() for v in d.values()]))
    seeds = sorted(set.intersection(*(set(d) for d in diffs.values())))

    def seed_means(names: list[str]) -> dict[int, float]:
        return {s: sum(diffs[n][s] for n in names) / len(names) for s in seeds}

    means = seed_means(list(diffs))
    rows.append(row("all (seed means)", list(means.values())))
    rows += [row(f"all (seed means) without seed {left}",
                 [v for s, v in means.items() if s != left]) for left in seeds]
    rows += [row(f"all (seed means) without {left}",
                 list(seed_means([n for n in diffs if n != left]).values())) for left in diffs]
    return rows


def read_scores(preset: Path, results: Path, reference_preset: Path, reference: Path,
                arms: tuple[str, str]) -> tuple[dict[str, dict[int, float]], ...]:
    """Each arm's val by setting and seed as selection-peers-dev's reading takes them (deviation
    1's set-aside cells left out, selection-dev's arms where the anchor reproduces), from
    committed archives read in place; only the settings the rule reads."""
    pre, dev = load_preset(preset), load_preset(reference_preset)
    res, commits = reference_results(pre, results)
    res, _ = set_aside(res, commits)
    dev_res, dev_commits = reference_results(dev, reference)
    found = collect(group(pre, res), group(dev, dev_res), pre.num_supernodes,
                    (commits, dev_commits))
    return tuple({s.name: dict(s.setting.scores[arm][VAL]) for s in found if s.decided}
                 for arm in arms)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path)
    p.add_argument("--results", type=Path, required=True,
                   help="the grid's results folder or committed records (archive parts)")
    p.add_argument("--reference-results", type=Path, required=True,
                   help="selection-dev's results folder or committed records")
    p.add_argument("--reference-preset", type=Path, default=Path("conf/selection-dev.toml"))
    p.add_argument("--challenger", default="hics-phi")
    p.add_argument("--incumbent", default="fedowen", help="Algorithm 2 (selection-dev's arm)")
    p.add_argument("--out", type=Path, required=True, help="the CSV written")
    args = p.parse_args(argv)
    challenger, incumbent = read_scores(args.preset, args.results, args.reference_preset,
                                        args.reference_results,
                                        (args.challenger, args.incumbent))
    rows = paired_rows(challenger, incumbent)
    write_csv(args.out, rows)
    for r in rows:
        print(f"{r['comparison']:50s} {r['mean_diff']:+.2f} [{r['ci_low']:+.2f}, "
              f"{r['ci_high']:+.2f}] p {r['p_t']:.2f}, {r['favouring']} of {r['pairs']}")
    print(f"[incumbent] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
