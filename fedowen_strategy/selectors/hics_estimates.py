"""HiCS-FL's estimates and draws as pure functions (:mod:`fedowen_strategy.selectors.hics`).

Chen & Vikalo, "Heterogeneity-Guided Client Sampling: Towards Fast and Efficient Non-IID
Federated Learning", NeurIPS 2024 (§3.2-3.4); official code CityChan/HiCS-FL
(``server/server_hics.py``, ``clustering.py``). Notation: ``g_k`` a client's update of the
output layer's bias (here per unit step: :class:`~fedowen_strategy.selectors.hics.Hics`), C
its length (the classes).

- label-skew estimate ``H_k = H(softmax(g_k / T))`` in nats (at most ``ln C``): a client
  whose data holds few labels pushes those labels' biases up, so its softmax is peaked;
- distance ``d(u, k) = arccos(cos(g_u, g_k)) + lambda |H_u - H_k|`` (0 for the angle when
  either update is zero, as the code's ``get_similarity``);
- Ward's hierarchical clustering of that distance into ``M`` clusters (scipy);
- cluster ``m`` drawn with ``pi_m = softmax(gamma_t * mean H over m)``, ``gamma_t = gamma_0 (1
  - (t - 1) / R)`` annealed to 0 over ``R`` rounds; ``k`` draws, a full cluster redrawn; then
  the cluster's count of clients uniformly within it (the code's; the paper draws in
  proportion to data size).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform
from scipy.special import entr, softmax

#: The suffixes that name a layer's parameters in a model state (torch's).
BIAS, WEIGHT = "bias", "weight"


def output_bias_key(state: Mapping[str, Any]) -> str | None:
    """The output layer's bias in a model state (its arrays by name, in the model's order):
    the last 1-D ``<layer>.bias`` whose ``<layer>.weight`` is a matrix with one row per bias
    entry (a linear layer's; a convolution's weight has 4 dimensions, a norm layer's 1).
    None when the model has no such layer."""
    found = None
    for name, array in state.items():
        if not name.endswith(BIAS) or np.ndim(array) != 1:
            continue
        weight = state.get(name[: -len(BIAS)] + WEIGHT)
        if weight is not None and np.ndim(weight) == 2 and np.shape(weight)[0] == len(array):
            found = name
    return found


def output_bias_problem(state: Mapping[str, Any]) -> str:
    """Why the model state ``state`` (its arrays by name, in the model's order) has no output
    bias HiCS-FL can read, '' when it has one: no :func:`output_bias_key`, or that bias is not
    the output layer's (an array of two or more dimensions follows it: the output layer has no
    bias or is not linear)."""
    name = output_bias_key(state)
    if name is None:
        return "it has no '<layer>.bias' beside a '<layer>.weight' matrix"
    names = list(state)
    later = [n for n in names[names.index(name) + 1:] if np.ndim(state[n]) >= 2]
    if later:
        return (f"its last linear layer's bias {name!r} ({len(state[name])} entries) is not "
                f"the output layer's: {later[-1]!r} follows it")
    return ""


def skew_entropy(updates: NDArray[np.float64], temperature: float) -> NDArray[np.float64]:
    """Each row's ``H(softmax(row / temperature))`` in nats (the paper's estimate of the
    entropy of the client's label distribution)."""
    p = softmax(np.asarray(updates, dtype=np.float64) / temperature, axis=1)
    return np.asarray(entr(p).sum(axis=1), dtype=np.float64)


def hics_distances(updates: NDArray[np.float64], entropy: NDArray[np.float64], lam: float
                   ) -> NDArray[np.float64]:
    """HiCS-FL's ``arccos(cos(g_u, g_k)) + lam |H_u - H_k|`` between every two rows (the angle
    is 0 where either row is zero, as the reference code's)."""
    g = np.asarray(updates, dtype=np.float64)
    norms = np.linalg.norm(g, axis=1)
    unit = g / np.where(norms > 0, norms, 1.0)[:, None]
    angle = np.arccos(np.clip(unit @ unit.T, -1.0, 1.0))
    zero = norms == 0
    angle[zero, :] = 0.0
    angle[:, zero] = 0.0
    np.fill_diagonal(angle, 0.0)
    h = np.asarray(entropy, dtype=np.float64)
    return np.asarray(angle + lam * np.abs(h[:, None] - h[None, :]), dtype=np.float64)


def ward_tree(distances: NDArray[np.float64]) -> NDArray[np.float64]:
    """Ward's hierarchical clustering of a square distance matrix of at least 2 rows: scipy's
    ``linkage`` matrix on the condensed (symmetrised) distances, i.e. of the distances
    themselves (the paper's; the code's ``linkage(sim_matrix, "ward")`` clusters the
    matrix's rows as points)."""
    d = np.asarray(distances, dtype=np.float64)
    return np.asarray(linkage(squareform((d + d.T) / 2.0, checks=False), method="ward"),
                      dtype=np.float64)


def ward_clusters(distances: NDArray[np.float64], m: int) -> NDArray[np.int64]:
    """Labels ``0..`` of :func:`ward_tree` cut into at most ``m`` clusters (``maxclust``);
    each row its own cluster when there are at most ``m``."""
    n = len(distances)
    if n <= m:
        return np.arange(n, dtype=np.int64)
    tree = ward_tree(distances)
    _, labels = np.unique(fcluster(tree, m, criterion="maxclust"), return_inverse=True)
    return np.asarray(labels, dtype=np.int64)


def annealed_gamma(gamma0: float, server_round: int, rounds: int) -> float:
    """``gamma0 (1 - (t - 1) / rounds)`` in round ``t`` (from 1), never below 0 (the code's
    ``gamma (E - e) / E`` with ``e = t - 1``)."""
    return gamma0 * max(0.0, 1.0 - (server_round - 1) / rounds)


def cluster_probabilities(mean_entropy: NDArray[np.float64], gamma: float
                          ) -> NDArray[np.float64]:
    """``softmax(gamma * mean_entropy)``: the clusters of more balanced clients first."""
    return np.asarray(softmax(gamma * np.asarray(mean_entropy, dtype=np.float64)),
                      dtype=np.float64)


def draw_cluster_counts(probs: NDArray[np.float64], capacity: NDArray[np.int64], draws: int,
                        rng: np.random.Generator) -> NDArray[np.int64]:
    """How many clients each cluster gives: ``draws`` clusters drawn one at a time with
    ``probs``, a full cluster (``capacity`` reached) redrawn, i.e. each draw from ``probs``
    renormalised over the clusters not yet full (uniform among them where all of theirs
    underflow to 0)."""
    capacity = np.asarray(capacity, dtype=np.int64)
    if not 0 <= draws <= capacity.sum():
        raise ValueError(f"cannot draw {draws} clients from clusters of {capacity.sum()}")
    counts = np.zeros(len(capacity), dtype=np.int64)
    for _ in range(draws):
        open_ = counts < capacity
        p = np.where(open_, probs, 0.0)
        p = p / p.sum() if p.sum() > 0 else open_ / open_.sum()
        counts[rng.choice(len(p), p=p)] += 1
    return counts


def cluster_slots(updates: NDArray[np.float64], available: NDArray[np.bool_], k: int, m: int,
                  gamma: float, temperature: float, lam: float, rng: np.random.Generator,
                  entropy: NDArray[np.float64] | None = None
                  ) -> tuple[NDArray[np.int64], NDArray[np.int64], dict[str, Any]]:
    """HiCS-FL's allocation of ``k`` slots to clusters of the rows of ``updates`` (one row per
    client the server has an estimate of): clusters of all rows, each cluster's mean entropy
    over all its members, clusters drawn among those with an ``available`` member (at most as
    often as they have). Returns each row's cluster, each cluster's slots (0 for one without an
    available member) and what the round record keeps: the clusters' count, the live clusters'
    probabilities and mean entropies, and the entropies' spread. ``entropy``: the rows'
    :func:`skew_entropy` at ``temperature``, when the caller has it."""
    available = np.asarray(available, dtype=bool)
    if not 1 <= k <= available.sum():
        raise ValueError(f"cannot select k={k} of {available.sum()} available clients")
    entropy = skew_entropy(updates, temperature) if entropy is None else entropy
    labels = ward_clusters(hics_distances(updates, entropy, lam), m)
    size = np.bincount(labels)
    mean = np.bincount(labels, weights=entropy) / size
    live = np.flatnonzero(np.bincount(labels[available], minlength=size.size) > 0)
    probs = cluster_probabilities(mean[live], gamma)
    capacity = np.bincount(labels[available], minlength=size.size)[live]
    slots = np.zeros(size.size, dtype=np.int64)
    slots[live] = draw_cluster_counts(probs, capacity, k, rng)
    info = {"clusters": int(size.size),
            "cluster_p": [round(float(p), 4) for p in probs],
            "cluster_entropy": [round(float(h), 4) for h in mean[live]],
            "entropy": [round(float(f(entropy)), 4) for f in (np.min, np.mean, np.max)]}
    return labels, slots, info


def hics_pick(updates: NDArray[np.float64], available: NDArray[np.bool_], k: int, m: int,
              gamma: float, temperature: float, lam: float, rng: np.random.Generator,
              entropy: NDArray[np.float64] | None = None
              ) -> tuple[NDArray[np.int64], dict[str, Any]]:
    """HiCS-FL's ``k`` of the ``available`` rows of ``updates``: :func:`cluster_slots` (given
    the rows' ``entropy`` when the caller has it), then each cluster's slots filled uniformly
    from its available members. Returns the rows, sorted, and :func:`cluster_slots`' record."""
    available = np.asarray(available, dtype=bool)
    labels, slots, info = cluster_slots(updates, available, k, m, gamma, temperature, lam, rng,
                                        entropy)
    picks: list[int] = []
    for cluster in np.flatnonzero(slots).tolist():
        members = np.flatnonzero((labels == cluster) & available)
        picks += rng.choice(members, size=int(slots[cluster]), replace=False).tolist()
    return np.sort(np.asarray(picks, dtype=np.int64)), info
