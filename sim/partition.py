"""Partitioning for virtual clients (re-export).

The implementation lives in :mod:`fedowen_task.partition` so the ClientApp can build its
partition without importing ``sim``: imports point apps -> task and sim -> apps, never back.
"""

from __future__ import annotations

from fedowen_task.partition import (
    SCHEMES,
    FederatedSplit,
    federated_split,
    long_tail_counts,
    long_tail_indices,
    partition_indices,
    server_eval_split,
    writer_partition,
)

__all__ = [
    "SCHEMES",
    "FederatedSplit",
    "federated_split",
    "long_tail_counts",
    "long_tail_indices",
    "partition_indices",
    "server_eval_split",
    "writer_partition",
]
