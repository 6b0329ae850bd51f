"""The sets held out from the clients: the server evaluation set and the validation set.

Step 1 of :mod:`fedowen_task.partition`'s setup (the FedOwen paper, Sec. 4.1): a stratified 1%
**server evaluation set** is drawn from the original training split, before anything else,
and never given to clients (:func:`server_eval_split`). A **validation set** for tuning
(``validation_fraction > 0``) is carved, stratified, from what the evaluation set leaves,
before the long-tailed transform: it is nobody's data, disjoint from the evaluation and test
sets (:func:`holdout_split`). The server rebuilds both from the run's seed alone, without
knowing the client split.
"""

from __future__ import annotations

import numpy as np

from fedowen_task.dirichlet import check_labels


def server_eval_split(
    labels: np.ndarray, fraction: float = 0.01, seed: int | np.random.SeedSequence = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified server evaluation set.

    Each class gives ``round(fraction * n_c)`` samples, at least one where ``n_c >= 2`` and
    never all of them. Returns ``(eval_idx, train_idx)``, sorted, disjoint, covering
    ``labels``.
    """
    labels = check_labels(labels)
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    chosen = []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        k = round(fraction * len(idx))
        k = min(max(k, 1), len(idx) - 1) if fraction > 0 and len(idx) >= 2 else 0
        chosen.append(rng.choice(idx, size=k, replace=False))
    eval_idx = np.sort(np.concatenate(chosen)).astype(np.int64)
    train_mask = np.ones(len(labels), dtype=bool)
    train_mask[eval_idx] = False
    return eval_idx, np.flatnonzero(train_mask).astype(np.int64)


def holdout_split(
    labels: np.ndarray, eval_fraction: float, validation_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(eval_idx, val_idx, pool)``: the server evaluation set, the validation set and the
    pool the clients' data is drawn from; sorted, disjoint, covering ``labels``.

    The evaluation set is ``server_eval_split(labels, eval_fraction, seed)[0]`` whatever the
    validation fraction; the validation set takes ``validation_fraction`` of each class of what
    is left (stratified, its own seed stream), so ``validation_fraction = 0`` leaves the pool,
    and every split drawn from it, exactly as without one.
    """
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    eval_idx, pool = server_eval_split(labels, eval_fraction, seed)
    if validation_fraction == 0:
        return eval_idx, np.empty(0, dtype=np.int64), pool
    val_local, rest = server_eval_split(labels[pool], validation_fraction,
                                        np.random.SeedSequence([seed, 0x7A1]))
    return eval_idx, pool[val_local], pool[rest]
