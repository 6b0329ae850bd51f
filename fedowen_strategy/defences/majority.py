"""FLAME's filter (Nguyen et al., USENIX Security 2022): keep the majority cluster of a round's
update directions, clip to the median norm, add noise to the aggregate.

A backdoor's updates carry a common direction (every attacker teaches the same trigger) that
the honest updates lack, and the clean evaluation set cannot see it. FLAME clusters the
round's updates by cosine distance with HDBSCAN, ``min_cluster_size = n // 2 + 1`` and
``min_samples = 1`` (one cluster may hold every update), and admits only the largest cluster:
a minority that points its own way is left out whatever its norm. Admitted updates are clipped
to the median norm of the round, and Gaussian noise of standard deviation ``lambda x`` that
median is added to the aggregate (``lambda = 0.001`` for image classification in the paper).
HDBSCAN is scikit-learn's. Pure functions of the updates and a generator: ``update-filter =
"majority"`` applies the filter alone, the ``flame`` defence all three
(:mod:`fedowen_strategy.defences.flame`).

With ``min_cluster_size = n // 2 + 1`` two clusters cannot form, so the one cluster is the
root (``allow_single_cluster``), and HDBSCAN labels a lone root cluster with only the points
still in it when it falls below that size: in a round of honest updates whose distances do
not tie, about ``n // 2 + 1`` are admitted (the hdbscan package, which the public codes call,
labels the same way; docs/defences.md, FLAME).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.updates import flat_deltas, gram_cosines, row_gram

if TYPE_CHECKING:
    from fedowen_strategy.replies import ClientUpdate

#: ``update-filter``: none, the majority cluster of update directions, or the updates that
#: point the way of the server's own step (:mod:`fedowen_strategy.defences.server_direction`).
UPDATE_FILTERS = ("none", "majority", "server-direction")
#: FLAME's noise level for image classification (the paper's lambda).
FLAME_NOISE = 0.001


def cosine_distances(flat: NDArray[np.floating]) -> NDArray[np.float64]:
    """``1 - cos`` between every pair of rows (a zero row is at distance 1 from all), the
    cosines in float64 (:func:`fedowen_strategy.updates.row_gram`)."""
    return np.clip(1.0 - gram_cosines(row_gram(flat)), 0.0, 2.0)


def cluster_labels(flat: NDArray[np.floating]) -> NDArray[np.int64]:
    """HDBSCAN's label of each row (-1: noise) on the rows' cosine distances, min cluster size
    a strict majority (``n // 2 + 1``), ``min_samples = 1``, one cluster allowed; every row
    label 0 when there are fewer than 3."""
    n = len(flat)
    if n < 3:
        return np.zeros(n, dtype=np.int64)
    from sklearn.cluster import HDBSCAN

    labels = HDBSCAN(min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed",
                     allow_single_cluster=True, copy=True).fit_predict(cosine_distances(flat))
    return np.asarray(labels, dtype=np.int64)


def largest_cluster(labels: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Which rows carry the most frequent non-noise label (ties: the lowest label); every row
    when all are noise."""
    found = labels[labels >= 0]
    if found.size == 0:
        return np.ones(len(labels), dtype=bool)
    return np.asarray(labels == np.bincount(found).argmax())


def majority_cluster(flat: NDArray[np.floating]) -> NDArray[np.bool_]:
    """Which rows lie in HDBSCAN's largest cluster of cosine distances (min cluster size a
    strict majority); every row when there are fewer than 3, or when no cluster forms."""
    return largest_cluster(cluster_labels(flat))


def clip_to_median(norms: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
    """Per update, the factor ``min(1, S / norm)`` with ``S`` the median norm, and ``S``."""
    median = float(np.median(norms))
    factors = np.where(norms > median, median / np.where(norms > 0, norms, 1.0), 1.0)
    return factors, median


def flame_noise(shape: tuple[int, ...], median_norm: float, rng: np.random.Generator,
                level: float = FLAME_NOISE) -> NDArray[np.float64]:
    """FLAME's noise on the aggregate: ``N(0, (level x median_norm)^2)`` per coordinate."""
    return rng.normal(0.0, level * median_norm, size=shape)


def filter_majority(updates: Sequence[ClientUpdate], global_state: Mapping[str, NDArray]
                    ) -> tuple[list[ClientUpdate], dict[str, str]]:
    """The updates in the majority cluster of their directions (:func:`majority_cluster`), and
    the others as rejected, with the reason."""
    keep = majority_cluster(flat_deltas([u.state for u in updates], global_state))
    reason = "outside the majority cluster of update directions (update-filter = majority)"
    return ([u for u, k in zip(updates, keep, strict=True) if k],
            {u.client_id: reason for u, k in zip(updates, keep, strict=True) if not k})
