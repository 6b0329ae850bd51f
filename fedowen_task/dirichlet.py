"""Dirichlet splits of labelled samples over clients (owner id per sample).

The two schemes and the minimum-size repair that :func:`fedowen_task.partition.
partition_indices` documents: ``per-class`` (each class cut into ``Dir(alpha)`` proportions),
the top-up that guarantees ``min_size`` without re-drawing, and ``per-client`` (each client's
label mix ``~ Dir(alpha)``).
"""

from __future__ import annotations

import numpy as np


def check_labels(labels: np.ndarray) -> np.ndarray:
    """``labels`` as a 1-D integer array; a clear error for anything else."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    return labels


def group_by_owner(indices: np.ndarray, owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """``indices`` cut into one sorted array per client, by ``owner`` (client id per index)."""
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(1, num_clients))
    return [np.sort(indices[part]) for part in np.split(order, bounds)]


def split_per_class(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """Owner (client id) per sample: each class cut into ``Dir(alpha)`` proportions."""
    owner = np.empty(len(labels), dtype=np.int64)
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, alpha)))[:-1] * len(idx)).astype(int)
        for client, chunk in enumerate(np.split(idx, cuts)):
            owner[chunk] = client
    return owner


def top_up(
    owner: np.ndarray, labels: np.ndarray, num_clients: int, min_size: int, rng: np.random.Generator
) -> None:
    """Move samples from the largest clients to those under ``min_size`` (in place).

    The donor is the currently largest client and gives samples of the class it holds most
    of, never going under ``min_size`` itself. Every move transfers at least one sample, so
    the loop ends; the caller has checked ``len(labels) >= num_clients * min_size``.
    """
    _, inv = np.unique(labels, return_inverse=True)
    held = np.zeros((num_clients, inv.max() + 1), dtype=np.int64)
    np.add.at(held, (owner, inv), 1)
    sizes = held.sum(axis=1)
    for client in np.flatnonzero(sizes < min_size):
        while sizes[client] < min_size:
            donor = int(np.argmax(sizes))
            cls = int(np.argmax(held[donor]))
            k = min(min_size - sizes[client], sizes[donor] - min_size, held[donor, cls])
            pool = np.flatnonzero((owner == donor) & (inv == cls))
            owner[rng.choice(pool, size=k, replace=False)] = client
            held[donor, cls] -= k
            held[client, cls] += k
            sizes[donor] -= k
            sizes[client] += k


def split_per_client(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """Owner per sample: each client's label mix ``~ Dir(alpha)``, sizes equal up to one."""
    classes, inv = np.unique(labels, return_inverse=True)
    pools = [rng.permutation(np.flatnonzero(inv == c)) for c in range(len(classes))]
    left = np.array([len(p) for p in pools], dtype=np.int64)
    sizes = np.full(num_clients, len(labels) // num_clients)
    sizes[: len(labels) % num_clients] += 1
    owner = np.empty(len(labels), dtype=np.int64)
    for client, size in enumerate(sizes):
        counts = np.zeros(len(classes), dtype=np.int64)
        weights = rng.dirichlet(np.full(len(classes), alpha))
        while (need := size - counts.sum()) > 0:
            room = left - counts
            w = np.where(room > 0, weights, 0.0)
            if w.sum() <= 0:  # the client's classes ran dry (or underflowed): redraw over the rest
                w = np.zeros(len(classes))
                w[room > 0] = rng.dirichlet(np.full(int((room > 0).sum()), alpha))
            counts += np.minimum(rng.multinomial(need, w / w.sum()), room)
        for c in np.flatnonzero(counts):
            start = len(pools[c]) - left[c]
            owner[pools[c][start : start + counts[c]]] = client
        left -= counts
    return owner
