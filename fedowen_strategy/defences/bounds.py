"""Robust per-round update bounds: clip or reject updates far above the round's median.

A bound relative to the *global model's* norm (``max-norm-ratio``) drifts: honest updates are
small against the global norm, so a far larger attacker passes, and each accepted one
inflates the global norm and loosens the guard further. Here every update ``d_i = W_i - W``
(floating arrays only) is compared with a robust statistic of the same round's updates.

Honest update norms grow with the local steps, i.e. with a client's examples, so in a
long-tail split a bound on the norm itself rejects the clients with the most data; their norms
*per example* stay comparable (measurements: docs/defaults.md). The statistic is therefore
``r_i = ||d_i|| / n_i``:

    bound_i = multiple * lower_median({r_j : r_j > 0}) * n_i

``clip`` scales ``d_i`` down to ``bound_i`` (it keeps its direction; norm clipping as in Sun
et al., "Can you really backdoor federated learning?", 2019), ``reject`` drops it with a
reason. The *lower* median (the ceil(n/2)-th smallest) stays an honest value whenever fewer
than half of the non-zero updates are inflated, also with two updates, where the plain median
would be the midpoint and let a 20x update through a 3x bound. Zero updates (free riders
returning the global model) are left out: they would pull the statistic to 0 and bound every
honest update away. The bound depends on the round's updates only, never on the global
model, so it does not drift as the model grows.

Off by default (``update-bound = "none"``): under strong non-IID data the statistic is not
robust. With one class per client, clients whose class the global model already predicts
return near-zero updates; once they are half of a round the lower median collapses and the
honest clients that bring a new class exceed any fixed multiple (docs/defaults.md). Use it
where honest updates are comparable in size.

Not defended: ``n_i`` is what the client claims (``num-examples``), so an attacker that
claims many examples widens its own bound (and, under FedAvg, its weight); attackers that are
at least half of a round's non-zero updates set the median.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.updates import combine, is_update, update_norm

if TYPE_CHECKING:  # only a type here: the numpy-only valuation side imports NORM_CAPS
    from fedowen_strategy.replies import ClientUpdate

log = logging.getLogger(__name__)

#: ``update-bound`` values: off, clip to the bound, reject beyond it.
UPDATE_BOUNDS = ("none", "clip", "reject")
#: ``norm-cap`` values: the reference norm every update is rescaled to at most (``auto``:
#: :data:`AUTO_NORM_CAP` for methods that compute contributions, ``none`` for the FedAvg
#: baselines; :func:`fedowen_strategy.round.contribution.resolve_auto` decides).
NORM_CAPS = ("auto", "none", "median", "server")
#: How the valuation's cap (``value-cap-multiple``) rescales an update: to at most the cap, or
#: every non-zero update to exactly it (the update's direction valued, never its size).
VALUE_CAP_MODES = ("at-most", "exactly")
#: What ``auto`` means for a valuation method: the round's lower-median update norm (with the
#: app's ``norm-cap-multiple = 2``), chosen by the development grid's written rule
#: (conf/defaults-dev-mnist.toml): of the references measured it alone held boosted, adaptive
#: and 30% label-flip updates on every development seed; the server step's norm (FLTrust's)
#: costs nothing without attack but let the adaptive and label-flip attackers through. What it
#: costs one-class clients at alpha 0.01 is in the README's defaults section.
AUTO_NORM_CAP = "median"


@dataclass
class BoundedRound:
    """Updates after bounding, who was rejected (reason) or clipped (factor applied), and the
    round's bound per example."""

    updates: list[ClientUpdate]
    rejected: dict[str, str] = field(default_factory=dict)
    clipped: dict[str, float] = field(default_factory=dict)
    bound: float | None = None


def round_bound(ratios: Sequence[float], multiple: float) -> float | None:
    """``multiple`` x the lower median of the positive per-example norms; None when all are
    zero (nothing moved: nothing to bound)."""
    median = lower_median(ratios)
    return None if median is None else float(multiple * median)


def example_bound(norms: Sequence[float], examples: Sequence[int], multiple: float
                  ) -> float | None:
    """The round's bound per example: ``multiple`` x the lower median of the positive
    ``norms[i] / examples[i]`` (updates claiming no examples left out); None when nothing
    moved. An update of ``n`` examples passes unchanged up to ``n`` x it."""
    return round_bound([nm / ex for nm, ex in zip(norms, examples, strict=True) if ex > 0],
                       multiple)


def clip_state(state: Mapping[str, NDArray], reference: Mapping[str, NDArray],
               factor: float) -> dict[str, NDArray]:
    """``reference + factor * (state - reference)`` on the update keys (in their dtype:
    :func:`fedowen_strategy.updates.combine`), the buffers as the client sent them
    (:mod:`fedowen_strategy.updates`)."""
    return {key: combine(ref, [state[key]], [factor]) if is_update(key, ref) else state[key]
            for key, ref in reference.items()}


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
    norms = norms_of(updates, reference)
    per_example = example_bound(norms, [u.num_examples for u in updates], multiple)
    out = BoundedRound([], bound=per_example)
    for upd, norm in zip(updates, norms, strict=True):
        bound = None if per_example is None else per_example * upd.num_examples
        if bound is None or norm <= bound:
            out.updates.append(upd)
        elif mode == "reject":
            out.rejected[upd.client_id] = (
                f"update norm {norm:.3g} exceeds {multiple:g} x the round's median update "
                f"norm per example x its {upd.num_examples} examples ({bound:.3g})")
            log.warning("rejected the update of client %s: %s", upd.client_id,
                        out.rejected[upd.client_id])
        else:
            factor = bound / norm
            out.clipped[upd.client_id] = factor
            out.updates.append(replace(upd, state=clip_state(upd.state, reference, factor),
                                       norm=None))
            log.info("clipped the update of client %s from norm %.3g to %.3g", upd.client_id,
                     norm, bound)
    return out


def norms_of(updates: Sequence[ClientUpdate], reference: Mapping[str, NDArray]) -> list[float]:
    """Each update's :func:`update_norm` to ``reference``: the one the reply check measured
    (``ClientUpdate.norm``, against the same global model) where it did."""
    return [upd.norm if upd.norm is not None else update_norm(upd.state, reference)
            for upd in updates]


def lower_median(values: Sequence[float]) -> float | None:
    """The lower median (the ceil(n/2)-th smallest) of the positive values; None if none."""
    positive = np.sort([v for v in values if v > 0.0])
    return None if positive.size == 0 else float(positive[(positive.size - 1) // 2])


def cap_norms(updates: Sequence[ClientUpdate], reference: Mapping[str, NDArray],
              cap: float | None, exactly: bool = False,
              norms: Sequence[float] | None = None) -> BoundedRound:
    """Norm normalisation: rescale every update whose norm exceeds ``cap`` to exactly ``cap``
    (its direction kept), before valuation and aggregation; smaller updates are untouched.

    With ``cap`` the round's lower-median update norm (``norm-cap = "median"``), no attacker
    short of half the round's non-zero updates can move it: a boosted update (any factor)
    weighs what a median honest one does, and an adaptive one gains nothing by sitting under
    it. ``None`` (nothing moved, or no reference): updates unchanged. ``exactly``: smaller
    updates are scaled up to ``cap`` too (a zero update stays zero), so every update has the
    same norm and only its direction differs. ``clipped`` holds the factor applied per client,
    ``bound`` the cap. ``norms``: the updates' :func:`update_norm` where the caller has them
    already (the same numbers, not computed twice on a large model).
    """
    out = BoundedRound([], bound=cap)
    if norms is None:
        norms = norms_of(updates, reference)
    for upd, norm in zip(updates, norms, strict=True):
        if cap is None or norm == 0.0 or norm == cap or (norm < cap and not exactly):
            out.updates.append(upd)
            continue
        factor = cap / norm
        out.clipped[upd.client_id] = factor
        out.updates.append(replace(upd, state=clip_state(upd.state, reference, factor),
                                       norm=None))
    return out
