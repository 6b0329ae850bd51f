"""FEMNIST's natural splits: clients made of whole writers.

``writer`` (:func:`writer_partition`) groups seeded writers into clients; ``writer-sample``
(:func:`writer_sample`) makes each of a fixed draw of writers one client. Both are schemes of
:func:`fedowen_task.partition.federated_split`, which applies them after the long-tailed
transform.
"""

from __future__ import annotations

import numpy as np

from fedowen_task.dirichlet import check_labels, group_by_owner

#: The seed of ``writer-sample``'s draw: fixed, so every run federates the same writers.
WRITER_DRAW_SEED = 0xFE


def writer_partition(writers: np.ndarray, num_clients: int,
                     seed: int | np.random.SeedSequence) -> list[np.ndarray]:
    """FEMNIST's natural split: each client is a seeded group of whole writers.

    With as many clients as writers each writer is one client; with fewer, the shuffled
    writers are cut into ``num_clients`` groups of (nearly) equal writer count, so the natural
    differences in data size between writers remain.
    """
    writers = check_labels(writers)
    ids = np.unique(writers)
    if not 1 <= num_clients <= len(ids):
        raise ValueError(f"num_clients must be in [1, {len(ids)}] (the writers), got {num_clients}")
    groups = np.array_split(np.random.default_rng(seed).permutation(ids), num_clients)
    owner = np.empty(len(writers), dtype=np.int64)
    for client, group in enumerate(groups):
        owner[np.isin(writers, group)] = client
    return group_by_owner(np.arange(len(writers), dtype=np.int64), owner, num_clients)


def writer_sample(writers: np.ndarray, num_clients: int,
                  seed: int | np.random.SeedSequence = WRITER_DRAW_SEED) -> list[np.ndarray]:
    """Writers as clients: ``num_clients`` writers drawn from ``seed``, one client each (in
    the order drawn); the other writers' samples are in no client."""
    writers = check_labels(writers)
    ids = np.unique(writers)
    if not 1 <= num_clients <= len(ids):
        raise ValueError(f"num_clients must be in [1, {len(ids)}] (the writers), got {num_clients}")
    drawn = np.random.default_rng(seed).choice(ids, size=num_clients, replace=False)
    return [np.flatnonzero(writers == w).astype(np.int64) for w in drawn]
