"""HiCS-FL's clustered branch (``hics-switch``) as pure functions: Fraboni et al.'s Algorithm 2.

The official HiCS-FL code (CityChan/HiCS-FL, ``server/server_hics.py``, ``cluster_sampling``)
draws from its entropy-guided clusters only while the variance of the clients' estimated
entropies is below 0.1; at or above it, it samples by Fraboni et al.'s clustered sampling
(``clustering.py``: ``get_clusters_with_alg2`` and ``sample_clients``): Fraboni, Vidal,
Kameni, Lorenzi, "Clustered Sampling: Low-Variance and Improved Representativity for Clients
Selection in Federated Learning", ICML 2021, Algorithm 2:

- the hierarchical clustering's merge heights are replaced by the merged clients' data-size
  weight, and the tree is cut at ``1/m``: flat clusters of weight at most ``1/m``;
- the ``m`` biggest clusters each start one of ``m`` distributions (a client ``i`` carries mass
  ``m p_i``, ``p_i`` its data-size share); the other clusters' clients, smallest cluster first
  and shuffled within it, fill the distributions greedily up to mass 1 each (a client may be
  split between two);
- one client is drawn from each distribution.

Each client's total mass over the ``m`` distributions is ``m p_i``, so a client is drawn
``m p_i`` times in expectation (an unbiased sample of the data-size-weighted objective).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.cluster.hierarchy import fcluster

from fedowen_strategy.selectors.hics_estimates import hics_distances, skew_entropy, ward_tree

#: Slack on mass comparisons (sums of float shares).
_TOL = 1e-12


def weight_cut_labels(tree: NDArray[np.float64], share: NDArray[np.float64], m: int
                      ) -> NDArray[np.int64]:
    """Labels ``0..`` of the flat clusters of weight at most ``1/m``: ``tree`` (scipy's
    linkage over ``len(share)`` leaves) with each merge's height replaced by the merged
    leaves' total ``share``, cut at ``1/m`` (``fcluster``, ``criterion="distance"``)."""
    n = len(share)
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    heights = np.asarray(tree, dtype=np.float64).copy()
    node = np.concatenate([share, np.zeros(n - 1)])
    for i, (a, b) in enumerate(heights[:, :2].astype(np.int64).tolist()):
        node[n + i] = node[a] + node[b]
        heights[i, 2] = node[n + i]
    labels = fcluster(heights, 1.0 / m + _TOL, criterion="distance")
    return np.asarray(np.unique(labels, return_inverse=True)[1], dtype=np.int64)


def clustered_distributions(tree: NDArray[np.float64], weights: NDArray[np.float64], m: int,
                            rng: np.random.Generator) -> NDArray[np.float64]:
    """Fraboni et al.'s Algorithm 2: ``m`` distributions (rows, each summing to 1) over the
    leaves of ``tree`` (scipy's linkage matrix), each leaf ``i`` of total mass ``m p_i`` over
    the rows, ``p = weights / sum(weights)``.

    The ``m`` biggest clusters of :func:`weight_cut_labels` are kept whole, one a row, in
    increasing mass (the code's order); the other clusters' leaves, smallest cluster first and
    each cluster's leaves in ``rng``'s order, fill the rows greedily from the first. A leaf
    heavier than ``1/m`` (its own cluster, of mass above 1) keeps mass 1 in its row and its
    excess fills first (the code normalises such a row instead, which under-weights it)."""
    return _distributions_and_labels(tree, weights, m, rng)[0]


def _distributions_and_labels(tree: NDArray[np.float64], weights: NDArray[np.float64], m: int,
                              rng: np.random.Generator
                              ) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """:func:`clustered_distributions` and the :func:`weight_cut_labels` they were built on."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"weights must be >= 0 and finite with a positive sum, got {w}")
    if not 1 <= m <= len(w):
        raise ValueError(f"m={m} distributions need 1 <= m <= {len(w)} (the leaves)")
    mass = m * w / w.sum()
    labels = weight_cut_labels(tree, w / w.sum(), m)
    order = np.argsort(np.bincount(labels, weights=mass), kind="stable")  # smallest first
    kept, rest = order[max(0, len(order) - m):], order[: max(0, len(order) - m)]
    rows = np.zeros((m, len(w)))
    queue: list[tuple[int, float]] = []  # (leaf, mass) left to fill, in order
    for r, cluster in enumerate(kept.tolist()):
        for leaf in np.flatnonzero(labels == cluster).tolist():
            rows[r, leaf] = min(mass[leaf], 1.0)
            if mass[leaf] > 1.0:
                queue.append((leaf, mass[leaf] - 1.0))
    for cluster in rest.tolist():
        queue += [(leaf, mass[leaf]) for leaf in rng.permutation(np.flatnonzero(labels == cluster))]
    fill(rows, queue)
    return rows / rows.sum(axis=1, keepdims=True), labels


def fill(rows: NDArray[np.float64], queue: list[tuple[int, float]]) -> None:
    """Pour each ``(leaf, mass)`` of ``queue`` into ``rows`` in place, filling each row up to
    1 before the next (the last row takes any rounding left over)."""
    r = 0
    for leaf, left in queue:
        while left > _TOL:
            room = 1.0 - rows[r].sum()
            if room <= _TOL and r < len(rows) - 1:
                r += 1
                continue
            put = left if r == len(rows) - 1 else min(room, left)
            rows[r, leaf] += put
            left -= put


def draw_distinct(distributions: NDArray[np.float64], available: NDArray[np.bool_],
                  rng: np.random.Generator) -> tuple[NDArray[np.int64], int]:
    """One distinct ``available`` column from each row of ``distributions``, row by row: a row
    is drawn from restricted to the available columns not drawn yet (the code's
    ``sample_clients`` draws each row independently, so a client can come twice); a row with
    no mass left there draws from the column sums (the clients' data-size shares) over them.
    Returns the columns, in the rows' order, and how many rows drew from the column sums."""
    p = np.asarray(distributions, dtype=np.float64)
    open_ = np.asarray(available, dtype=bool).copy()
    if open_.sum() < len(p):
        raise ValueError(f"cannot draw {len(p)} distinct of {open_.sum()} available clients")
    share = p.sum(axis=0)
    picks, fallback = [], 0
    for row in p:
        q = np.where(open_, row, 0.0)
        if q.sum() <= _TOL:
            fallback += 1
            q = np.where(open_, share, 0.0)
            q = q if q.sum() > _TOL else open_.astype(np.float64)
        pick = int(rng.choice(len(q), p=q / q.sum()))
        picks.append(pick)
        open_[pick] = False
    return np.asarray(picks, dtype=np.int64), fallback


def entropy_variance(entropy: NDArray[np.float64]) -> float:
    """The variance (numpy's) of the clients' :func:`skew_entropy`: what ``hics-switch``
    compares (the code's ``np.array(estimated_H).var()``); 0 for no client."""
    return float(np.var(entropy)) if len(entropy) else 0.0


def clustered_pick(updates: NDArray[np.float64], weights: NDArray[np.float64],
                   available: NDArray[np.bool_], k: int, temperature: float, lam: float,
                   rng: np.random.Generator, entropy: NDArray[np.float64] | None = None
                   ) -> tuple[NDArray[np.int64], dict[str, Any]]:
    """``k`` distinct ``available`` rows of ``updates`` by Fraboni's Algorithm 2 over all the
    rows (:func:`clustered_distributions` of ``k`` distributions, ``weights`` their data
    sizes) on HiCS-FL's Ward tree of its distances (the entropy branch's), then
    :func:`draw_distinct`. ``entropy``: the rows' :func:`skew_entropy` at ``temperature``,
    when the caller has it. Returns the rows, sorted, and what the round record keeps: the
    clusters at the ``1/k`` cut and the rows drawn from the data-size shares instead."""
    entropy = skew_entropy(updates, temperature) if entropy is None else entropy
    distances = hics_distances(updates, entropy, lam)
    tree = ward_tree(distances) if len(updates) > 1 else np.zeros((0, 4))
    rows, labels = _distributions_and_labels(tree, weights, k, rng)
    picks, fallback = draw_distinct(rows, available, rng)
    info = {"clusters": int(labels.max() + 1), "by_size": fallback}
    return np.sort(picks), info
