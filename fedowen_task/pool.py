"""The clients' pool of a run's training data, and whether a federation of N clients fits it.

Every ClientApp cuts its partition from the same pool (:func:`fedowen_task.partition.
federated_split`); when N partitions of ``min-partition-size`` cannot be cut, each of them
raises alike, round after round. :func:`check_clients_fit` says so before the first round,
where the run's keys are: in the CLI (``--supernodes``) and in the ServerApp (the nodes
connected at the start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedowen_task.data import DatasetArrays
from fedowen_task.holdout import holdout_split
from fedowen_task.partition import _children, long_tail_indices

if TYPE_CHECKING:
    from fedowen_task.config import TaskConfig


def client_pool(ds: DatasetArrays, *, imbalance_factor: float, seed: int,
                eval_fraction: float = 0.01, validation_fraction: float = 0.0) -> np.ndarray:
    """Indices into ``ds.y_train`` of the samples :func:`federated_split` divides among the
    clients: the training split less the server's sets, after the long-tailed transform, by
    the same draws (so without the clients' split, which needs their number)."""
    _, _, pool = holdout_split(ds.y_train, eval_fraction, validation_fraction, seed)
    tail_seq = _children(_children(seed, 1)[0], 2)[0]  # partition_indices' own first child
    return pool[long_tail_indices(ds.y_train[pool], imbalance_factor, tail_seq)]


def check_clients_fit(ds: DatasetArrays, cfg: TaskConfig, num_clients: int) -> None:
    """Raise ``ValueError``, in the run config's words, when ``num_clients`` partitions of at
    least ``min-partition-size`` cannot be cut from :func:`client_pool`: every ClientApp would
    raise it alike, round after round. Fewer partitions than ``num_clients`` always fit when
    these do, so the nodes connected at the start (each its own partition) are a safe
    ``num_clients`` for a ServerApp that cannot see the SuperNodes' ``num-partitions``."""
    size, kept = cfg.min_partition_size, len(client_pool(
        ds, imbalance_factor=cfg.imbalance_factor, seed=cfg.seed,
        eval_fraction=cfg.eval_fraction, validation_fraction=cfg.validation_fraction))
    if kept >= num_clients * size:
        return
    raise ValueError(
        f"dataset={cfg.dataset}: the clients' pool keeps {kept} of {len(ds.y_train)} training "
        f"samples (after eval-fraction={cfg.eval_fraction}, validation-fraction="
        f"{cfg.validation_fraction} and imbalance-factor={cfg.imbalance_factor}), too few for "
        f"{num_clients} clients of min-partition-size={size}: run at most {kept // size} "
        "clients (--supernodes, num-supernodes), lower min-partition-size, or set "
        "imbalance-factor=0 (the data's own class counts)")
