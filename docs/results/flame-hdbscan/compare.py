"""Do FLAME's clusters here match the public codes'? The ``hdbscan`` package as BackFed and
FLPoison call it (``metric="cosine"``, ``algorithm="generic"``, ``min_cluster_size = n // 2 +
1``, ``min_samples = 1``, ``allow_single_cluster``) against scikit-learn's ``HDBSCAN`` on
precomputed cosine distances, the call of :func:`fedowen_strategy.defences.majority.
cluster_labels` (rewritten here on numpy so that this runs in a venv with ``hdbscan``, which
the project's does not hold).

Usage (a throwaway venv: ``pip install hdbscan==0.8.40 scikit-learn==1.7.2``; hdbscan 0.8.40
fails on scikit-learn 1.8+, which dropped ``check_array(force_all_finite=...)``):
``python docs/results/flame-hdbscan/compare.py [ROUNDS.npz]``. Prints how many random rounds
give the same labels and how many of an all-honest round each admits; with ``ROUNDS.npz``, also
writes those rounds (float32) and the package's labels there, for ``project_labels.py`` to run
the project's own function on them in the project's venv.
"""

from __future__ import annotations

import math
import sys

import hdbscan
import numpy as np
from sklearn.cluster import HDBSCAN


def ours(flat: np.ndarray) -> np.ndarray:
    """sklearn's HDBSCAN on ``1 - cos`` (clipped to [0, 2]), as majority.py calls it."""
    gram = flat @ flat.T
    lengths = np.sqrt(np.diag(gram))
    distances = np.clip(1.0 - gram / np.maximum(np.outer(lengths, lengths), 1e-300), 0.0, 2.0)
    return np.asarray(HDBSCAN(min_cluster_size=len(flat) // 2 + 1, min_samples=1,
                              metric="precomputed", allow_single_cluster=True,
                              copy=True).fit_predict(distances))


def public(flat: np.ndarray) -> np.ndarray:
    """The hdbscan package as BackFed's FlameServer and FLPoison's FLAME call it."""
    return np.asarray(hdbscan.HDBSCAN(metric="cosine", algorithm="generic",
                                      min_cluster_size=len(flat) // 2 + 1, min_samples=1,
                                      allow_single_cluster=True).fit_predict(flat))


def at(degrees: float, norm: float) -> list[float]:
    angle = math.radians(degrees)
    return [norm * math.cos(angle), norm * math.sin(angle), 0.0, 0.0]


def main() -> None:
    rng = np.random.default_rng(0)
    same = total = 0
    honest_admitted: dict[int, list[int]] = {}
    saved: dict[str, np.ndarray] = {}
    for n in (5, 7, 10, 20, 30):
        for _ in range(40):
            flat = np.ones(50) + 0.6 * rng.normal(size=(n, 50))
            attackers = int(rng.integers(0, n // 2))  # a minority near one trigger direction
            trigger = rng.normal(size=50)
            for i in range(attackers):
                flat[i] = 5 * (trigger + 0.05 * rng.normal(size=50))
            flat = flat.astype(np.float32).astype(np.float64)  # the updates' float32
            a, b = ours(flat), public(flat)
            saved[f"round{total}"], saved[f"labels{total}"] = flat.astype(np.float32), b
            total += 1
            same += bool(np.array_equal(a, b))
            if attackers == 0:
                honest_admitted.setdefault(n, []).append(int((b >= 0).sum()))
    print(f"identical labels: {same} of {total} random rounds")
    if len(sys.argv) > 1:
        np.savez(sys.argv[1], **saved)
    for n, counts in honest_admitted.items():
        print(f"all-honest n={n}: admitted {sorted(counts)} (n // 2 + 1 = {n // 2 + 1})")
    test_round = np.array([at(d, m) for d, m in
                           [(0, 5), (1, 1), (2, 2), (3, 3), (10, 4), (100, 10), (100, 20)]])
    print("tests/test_flame.py's round: ours", ours(test_round).tolist(),
          "hdbscan", public(test_round).tolist())
    orthogonal = np.eye(4)[:3] * np.array([[1.0], [2.0], [4.0]])
    print("three orthogonal: ours", ours(orthogonal).tolist(),
          "hdbscan", public(orthogonal).tolist())


if __name__ == "__main__":
    main()
