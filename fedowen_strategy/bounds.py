"""Robust per-round update bounds: clip or reject updates far above the round's median norm.

A bound relative to the *global model's* norm (``max-norm-ratio``) drifts: honest updates are
a tenth of the global norm, so an attacker 30-100x an honest update passes, and each accepted
one inflates the global norm and loosens the guard further. Here every update ``d_i = W_i - W``
(floating arrays only) is compared with a robust statistic of the same round's updates:

    bound = multiple * lower_median({||d_j|| : ||d_j|| > 0})

``clip`` scales ``d_i`` down to the bound (the update keeps its direction; norm-clipping as in
Sun et al., "Can you really backdoor federated learning?", 2019), ``reject`` drops it with a
reason. The *lower* median (the ceil(n/2)-th smallest norm) stays an honest norm whenever
fewer than half of the non-zero updates are inflated, also with two updates, where the plain
median would be the midpoint and let a 20x update through a 3x bound. Zero updates (free
riders returning the global model) are left out of the statistic: they would pull it to 0
and clip every honest update away. The bound depends on the round's updates only, never on
the global model, so it does not drift as the model grows.

Not defended: when attackers are at least half of a round's non-zero updates they set the
median; small (but not zero) attacker updates then shrink the bound and slow training.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.replies import ClientUpdate

log = logging.getLogger(__name__)

#: ``update-bound`` values: off, clip to the bound, reject beyond it.
UPDATE_BOUNDS = ("none", "clip", "reject")


@dataclass
class BoundedRound:
    """Updates after bounding, plus who was rejected (reason) or clipped (factor applied)."""

    updates: list[ClientUpdate]
    rejected: dict[str, str] = field(default_factory=dict)
    clipped: dict[str, float] = field(default_factory=dict)
    bound: float | None = None


def update_norm(state: Mapping[str, NDArray], reference: Mapping[str, NDArray]) -> float:
    """L2 norm of ``state - reference`` over the floating arrays (counters are ignored)."""
    total = 0.0
    for key, ref in reference.items():
        if np.issubdtype(ref.dtype, np.floating):
            total += float(np.sum(np.square(state[key].astype(np.float64) - ref)))
    return float(np.sqrt(total))


def round_bound(norms: Sequence[float], multiple: float) -> float | None:
    """``multiple`` x the lower median of the positive norms; None when all are zero."""
    positive = np.sort([n for n in norms if n > 0.0])
    if positive.size == 0:
        return None
    return float(multiple * positive[(positive.size - 1) // 2])


def clip_state(state: Mapping[str, NDArray], reference: Mapping[str, NDArray],
               factor: float) -> dict[str, NDArray]:
    """``reference + factor * (state - reference)`` for floating arrays, others unchanged."""
    out: dict[str, NDArray] = {}
    for key, ref in reference.items():
        arr = state[key]
        if np.issubdtype(ref.dtype, np.floating):
            delta = arr.astype(np.float64) - ref
            out[key] = (ref + factor * delta).astype(ref.dtype)
        else:
            out[key] = arr
    return out


def bound_updates(updates: Sequence[ClientUpdate], reference: Mapping[str, NDArray],
                  mode: str, multiple: float) -> BoundedRound:
    """Apply the round's bound to every update (see the module docstring).

    Raises
    ------
    ValueError
        If ``mode`` is not one of :data:`UPDATE_BOUNDS` or ``multiple`` is not > 1.
    """
    if mode not in UPDATE_BOUNDS:
        raise ValueError(f"update-bound={mode!r} is not one of {UPDATE_BOUNDS}")
    if not multiple > 1.0:
        raise ValueError(f"update-bound-multiple={multiple!r} must be > 1 (e.g. 3)")
    if mode == "none" or not updates:
        return BoundedRound(list(updates))
    norms = [update_norm(u.state, reference) for u in updates]
    bound = round_bound(norms, multiple)
    out = BoundedRound([], bound=bound)
    for upd, norm in zip(updates, norms, strict=True):
        if bound is None or norm <= bound:
            out.updates.append(upd)
        elif mode == "reject":
            out.rejected[upd.client_id] = (
                f"update norm {norm:.3g} exceeds {multiple:g} x the round's median update "
                f"norm ({bound:.3g})")
            log.warning("rejected the update of client %s: %s", upd.client_id,
                        out.rejected[upd.client_id])
        else:
            factor = bound / norm
            out.clipped[upd.client_id] = factor
            out.updates.append(replace(upd, state=clip_state(upd.state, reference, factor)))
            log.info("clipped the update of client %s from norm %.3g to %.3g", upd.client_id,
                     norm, bound)
    return out
