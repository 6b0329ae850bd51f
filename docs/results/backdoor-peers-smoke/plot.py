"""smoke-rounds.png from smoke-rounds.csv.gz: test accuracy per round by arm (left), and the
attackers (solid) and honest clients (light, stacked) each filter rejected per round (right).

Usage, from the repository root: python docs/results/backdoor-peers-smoke/plot.py
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent


def main() -> None:
    with gzip.open(HERE / "smoke-rounds.csv.gz", "rt") as f:
        rows = list(csv.DictReader(f))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig, (acc, rej) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, arm in enumerate(arms):
        mine = [r for r in rows if r["arm"] == arm]
        rounds = [int(r["round"]) for r in mine]
        acc.plot(rounds, [float(r["test_accuracy"]) for r in mine], marker="o", ms=3, label=arm)
        if arm == "defaults":
            continue
        x = [t + 0.2 * (i - 2) for t in rounds]
        attackers = [int(r["attackers_rejected"]) for r in mine]
        rej.bar(x, attackers, width=0.2, color=f"C{i}", label=f"{arm}: attackers")
        rej.bar(x, [int(r["honest_rejected"]) for r in mine], width=0.2, bottom=attackers,
                color=f"C{i}", alpha=0.4, label=f"{arm}: honest (on top)")
    acc.set(xlabel="round", ylabel="test accuracy", title="MNIST, 20% backdoor, seed 0")
    rej.set(xlabel="round", ylabel="rejected of 10", title="rejected per round", ylim=(0, 14))
    acc.legend(fontsize=8)
    rej.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(HERE / "smoke-rounds.png", dpi=80)


if __name__ == "__main__":
    main()
