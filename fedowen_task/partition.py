"""Virtual-client partitions: server evaluation set, long-tailed transform, Dirichlet split.

The setup follows the FedOwen paper (Sec. 4.1 and Appendix "Long-Tailed Class Distribution"):

1. A stratified 1% **server evaluation set** is drawn from the original training split, before
   anything else, and never given to clients (:func:`fedowen_task.holdout.server_eval_split`).
   Reported accuracy uses the official test split.
2. The **long-tailed transform** of Shang et al. (2022, CReFF) is applied to the rest
   (:func:`long_tail_indices`): the class of rank ``r`` keeps ``n_max * IF ** (r / (C - 1))``
   samples (floored, at least one). The rank order is a seeded permutation of the classes, so
   which classes are head and tail changes with the seed. ``n_max`` is the largest value for
   which every class can supply its quota, so the kept counts follow the geometric profile
   exactly on any label distribution and ``IF = 1`` gives exactly balanced classes (cut to
   the rarest class). On the naturally balanced datasets ``n_max`` is close to the head
   class's size; on FEMNIST, whose letters are ~10x rarer than its digits, it shrinks the
   data considerably, as any exact profile must.
3. A **Dirichlet split** over the clients (:func:`partition_indices`), by ``scheme``:

   ``per-class`` (default)
       Every class is spread over the clients with proportions ``~ Dir(alpha)``, as in
       NIID-Bench (Li et al., 2022) and flwr-datasets' ``DirichletPartitioner``; this is the
       common reading of "Dirichlet client split" in the FL literature, hence the default.
       Client sizes vary a lot. We do not call ``DirichletPartitioner``: it meets its
       ``min_partition_size`` by re-drawing, gives up after 10 tries with a ``ValueError``,
       and at ``alpha = 0.01`` with 100 clients about 46 clients are empty in every draw.
       Instead, after one draw, clients below ``min_size`` are topped up from the currently
       largest client, taking samples of the class that donor holds most of; each move
       transfers at least one sample, so the repair ends after at most
       ``num_clients * min_size`` moves (in practice one per needy client).
   ``per-client``
       Every client's label mix is ``~ Dir(alpha)`` (Hsu et al., 2019); client sizes are equal
       up to one sample, drawn from the long-tailed class pools without replacement. When a
       client's classes run dry its remaining quota is redrawn over the classes left, so late
       clients can be more mixed than ``alpha`` suggests.
   ``writer`` (FEMNIST only, :func:`federated_split`)
       The natural split: clients are groups of whole writers
       (:func:`fedowen_task.writers.writer_partition`).
   ``writer-sample`` (FEMNIST only)
       Writers as clients: ``num_clients`` writers drawn with a fixed seed (the same writers in
       every run, whatever its ``seed``: one federation, many runs), each writer one client;
       the other writers' samples are used by nobody (:func:`fedowen_task.writers.writer_sample`).

``imbalance_factor = 0`` skips the long-tailed transform: the data's own class counts (the
natural split of FEMNIST, BreastMNIST's own imbalance). A **validation set** for tuning
(``validation_fraction > 0``) is carved, stratified, from what the evaluation set leaves,
before the transform: it is nobody's data, disjoint from the evaluation and test sets
(:func:`fedowen_task.holdout.holdout_split`).

Randomness comes from ``np.random.SeedSequence(seed)`` children, one per step; the global RNG
is never used. :func:`federated_split` is the one entry point the apps use; it is cached per
process so a Ray actor that builds its client's partition on every call pays once.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import numpy as np

from fedowen_task.data import DatasetArrays
from fedowen_task.dirichlet import (
    check_labels,
    group_by_owner,
    split_per_class,
    split_per_client,
    top_up,
)
from fedowen_task.holdout import holdout_split
from fedowen_task.writers import writer_partition, writer_sample

log = logging.getLogger(__name__)

SCHEMES: tuple[str, ...] = ("per-class", "per-client", "writer", "writer-sample")
WRITER_SCHEMES = ("writer", "writer-sample")
SeedLike = int | np.random.SeedSequence


@dataclass(frozen=True, eq=False)
class FederatedSplit:
    """Indices into ``ds.x_train``: the server evaluation set, one array per client and the
    validation set (empty unless asked for)."""

    eval_idx: np.ndarray
    client_idx: tuple[np.ndarray, ...]
    val_idx: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def num_clients(self) -> int:
        return len(self.client_idx)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(idx) for idx in self.client_idx], dtype=np.int64)


def _children(seed: SeedLike, k: int) -> list[np.random.SeedSequence]:
    """``k`` independent child sequences, without mutating a passed-in ``SeedSequence``."""
    root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return [
        np.random.SeedSequence(
            root.entropy, spawn_key=(*root.spawn_key, i), pool_size=root.pool_size
        )
        for i in range(k)
    ]


def _rng(seed: np.random.Generator | SeedLike) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def long_tail_counts(
    class_counts: np.ndarray, ranks: np.ndarray, imbalance_factor: float
) -> np.ndarray:
    """Kept samples per class: ``floor(n_max * IF ** (rank / (C - 1)))``, at least one.

    ``n_max`` is the largest value every class can supply (see the module docstring).
    """
    if not 0.0 < imbalance_factor <= 1.0:
        raise ValueError(f"imbalance_factor must be in (0, 1], got {imbalance_factor}")
    counts = np.asarray(class_counts, dtype=np.int64)
    if len(counts) == 1:
        return counts.copy()
    ratios = imbalance_factor ** (np.asarray(ranks, dtype=np.float64) / (len(counts) - 1))
    n_max = np.floor(np.min(counts / ratios) + 1e-9)
    quotas = np.floor(n_max * ratios + 1e-9).astype(np.int64)
    return np.clip(quotas, 1, counts)


def long_tail_indices(
    labels: np.ndarray, imbalance_factor: float, rng_or_seed: np.random.Generator | SeedLike
) -> np.ndarray:
    """Sorted indices of the samples kept by the long-tailed transform.

    The head-to-tail order of the classes is a permutation drawn from ``rng_or_seed``; the
    samples kept within a class are drawn uniformly without replacement.
    ``imbalance_factor = 0`` keeps every sample (the data's own class counts).
    """
    labels = check_labels(labels)
    if imbalance_factor == 0:
        return np.arange(len(labels), dtype=np.int64)
    rng = _rng(rng_or_seed)
    classes, counts = np.unique(labels, return_counts=True)
    ranks = np.empty(len(classes), dtype=np.int64)
    ranks[rng.permutation(len(classes))] = np.arange(len(classes))
    quotas = long_tail_counts(counts, ranks, imbalance_factor)
    kept = [
        rng.choice(np.flatnonzero(labels == cls), size=q, replace=False)
        for cls, q in zip(classes, quotas, strict=True)
    ]
    return np.sort(np.concatenate(kept)).astype(np.int64)


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    imbalance_factor: float,
    seed: SeedLike,
    min_size: int = 10,
    scheme: str = "per-class",
) -> list[np.ndarray]:
    """Long-tailed transform, then a Dirichlet split of the kept samples over the clients.

    Parameters
    ----------
    labels : np.ndarray
        Integer class labels of the pool to split (1-D).
    num_clients : int
    alpha : float
        Dirichlet concentration (> 0); small is heterogeneous, large near uniform.
    imbalance_factor : float
        Tail-to-head ratio in (0, 1]; 1 gives balanced classes, 0 keeps the data's own.
    seed : int or np.random.SeedSequence
    min_size : int
        Every client gets at least this many samples.
    scheme : {"per-class", "per-client"}
        See the module docstring.

    Returns
    -------
    list of np.ndarray
        One sorted ``int64`` index array into ``labels`` per client, pairwise disjoint; samples
        dropped by the long-tailed transform appear in none.
    """
    labels = check_labels(labels)
    if scheme not in ("per-class", "per-client"):
        raise ValueError(f"scheme must be 'per-class' or 'per-client', got {scheme!r}")
    if num_clients < 1 or min_size < 0 or not alpha > 0 or not np.isfinite(alpha):
        raise ValueError(
            f"need num_clients >= 1, min_size >= 0, finite alpha > 0; got {num_clients}, "
            f"{min_size}, {alpha}"
        )
    tail_seq, split_seq = _children(seed, 2)
    kept = long_tail_indices(labels, imbalance_factor, tail_seq)
    if len(kept) < num_clients * min_size:
        raise ValueError(
            f"The long-tailed pool has {len(kept)} samples (imbalance_factor={imbalance_factor}"
            f"), too few for {num_clients} clients with min_size={min_size}: lower min_size "
            "(min-partition-size) or num_clients (num-supernodes), or raise imbalance_factor "
            "(imbalance-factor; 0 keeps the data's own counts)."
        )
    rng = np.random.default_rng(split_seq)
    if scheme == "per-class":
        owner = split_per_class(labels[kept], num_clients, alpha, rng)
        top_up(owner, labels[kept], num_clients, min_size, rng)
    else:
        owner = split_per_client(labels[kept], num_clients, alpha, rng)
    return group_by_owner(kept, owner, num_clients)


@functools.lru_cache(maxsize=16)
def federated_split(
    ds: DatasetArrays,
    *,
    num_clients: int,
    alpha: float,
    imbalance_factor: float,
    seed: int,
    scheme: str = "per-class",
    min_size: int = 10,
    eval_fraction: float = 0.01,
    validation_fraction: float = 0.0,
) -> FederatedSplit:
    """Server evaluation set and client partitions of ``ds.x_train``, as the apps use them.

    The evaluation set is drawn first from the full training split (stratified) and equals
    ``server_eval_split(ds.y_train, eval_fraction, seed)[0]``; the validation set (if any) is
    drawn next (:func:`fedowen_task.holdout.holdout_split`); the long-tailed transform and the
    split act on the rest. ``scheme="writer"`` and ``"writer-sample"`` (FEMNIST) use the
    natural per-writer split after the long-tailed transform; ``alpha`` is then unused.
    Cached per process by argument (``ds`` by identity); the returned arrays are read-only.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    # The evaluation set uses ``seed`` itself, so a server calling
    # ``server_eval_split(ds.y_train, eval_fraction, seed)`` gets exactly this set without
    # knowing the client split; the split uses a spawned child stream, independent of it.
    eval_idx, val_idx, pool = holdout_split(ds.y_train, eval_fraction, validation_fraction,
                                            seed)
    part_seq = _children(seed, 1)[0]
    if scheme in WRITER_SCHEMES:
        parts = _writer_split(ds, pool, num_clients, imbalance_factor, min_size, part_seq,
                              scheme)
    else:
        parts = partition_indices(
            ds.y_train[pool], num_clients, alpha, imbalance_factor, part_seq, min_size, scheme
        )
    client_idx = tuple(pool[p] for p in parts)
    for arr in (eval_idx, val_idx, *client_idx):
        arr.setflags(write=False)
    sizes = [len(p) for p in client_idx]
    log.info(
        "%s split (%s, alpha=%s, IF=%s, seed=%s): eval %d, %d clients, %d samples, sizes %d..%d",
        ds.name, scheme, alpha, imbalance_factor, seed, len(eval_idx), num_clients,
        sum(sizes), min(sizes), max(sizes),
    )  # fmt: skip
    return FederatedSplit(eval_idx=eval_idx, client_idx=client_idx, val_idx=val_idx)


def _writer_split(
    ds: DatasetArrays,
    pool: np.ndarray,
    num_clients: int,
    imbalance_factor: float,
    min_size: int,
    seed: np.random.SeedSequence,
    scheme: str = "writer",
) -> list[np.ndarray]:
    if ds.writer_train is None:
        raise ValueError(f"scheme {scheme!r} needs per-sample writers; {ds.name} has none")
    tail_seq, split_seq = _children(seed, 2)
    kept = long_tail_indices(ds.y_train[pool], imbalance_factor, tail_seq)
    writers = ds.writer_train[pool][kept]
    parts = (writer_partition(writers, num_clients, split_seq) if scheme == "writer"
             else writer_sample(writers, num_clients))
    smallest = min(len(p) for p in parts)
    if smallest < min_size:
        raise ValueError(
            f"The writer split leaves a client with {smallest} < min_size={min_size} samples "
            f"(imbalance_factor={imbalance_factor}): lower min_size or num_clients."
        )
    return [kept[p] for p in parts]

