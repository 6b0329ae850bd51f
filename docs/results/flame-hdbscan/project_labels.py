"""The project's own :func:`fedowen_strategy.defences.majority.cluster_labels` (float32
updates through :func:`fedowen_strategy.updates.flat_deltas`) on the rounds compare.py wrote,
against the hdbscan package's labels saved beside them.

Usage, from the repository root, in the project's venv:
``PYTHONPATH=. python docs/results/flame-hdbscan/project_labels.py ROUNDS.npz``.
"""

from __future__ import annotations

import sys

import numpy as np

from fedowen_strategy.defences.majority import cluster_labels
from fedowen_strategy.updates import flat_deltas


def main(path: str) -> None:
    saved = np.load(path)
    count = sum(1 for name in saved.files if name.startswith("round"))
    same = 0
    for i in range(count):
        rows = saved[f"round{i}"]
        zero = {"w": np.zeros(rows.shape[1], np.float32)}
        mine = cluster_labels(flat_deltas([{"w": r} for r in rows], zero))
        same += bool(np.array_equal(mine, saved[f"labels{i}"]))
    print(f"the project's labels equal the hdbscan package's in {same} of {count} rounds")


if __name__ == "__main__":
    main(sys.argv[1])
