"""A bound on the normalisation statistics a client sends (``statistics-cap``, opt-in).

The update guards read only the update keys (:mod:`fedowen_strategy.updates`): BatchNorm's
running statistics (arrays named ``*running_mean`` / ``*running_var``) are averaged with the
aggregation weights and nothing measures them. One client sending a huge but valid
``running_var`` (1e6, say) at any weight w > 0 (FedOwen's softmax weights never are 0) divides
every normalised activation of the global model by about ``sqrt(w x 1e6)``: the model is
broken however tight the norm cap on its update.

Here each update's *statistics deviation* ``s_i = S_i - S`` (its statistics minus the global
model's, over every statistics array, in float64) is measured by its L2 norm, accumulated
array by array as :func:`fedowen_strategy.updates.update_norm` does, and capped at

    cap = multiple x lower_median({||s_j|| : ||s_j|| > 0})

(:func:`fedowen_strategy.defences.bounds.lower_median`: no attacker short of half of the round's
non-zero deviations moves it). A client above it sends ``S + s_i x cap / ||s_i||``: a convex
combination of its statistics and the global model's, so a variance stays non-negative. Its
update keys are untouched (the norm cap's business).

Off by default (``multiple = 0``): honest statistics move far in one local epoch (ResNet-18 on
CIFAR-10: 27-183 in L2, against 4.5-7.3 for the parameters), and how far apart honest clients'
moves are has not been measured, so a tight cap may clip honest clients too. A multiple below 1
caps the median client as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.bounds import lower_median
from fedowen_strategy.updates import STATISTICS

if TYPE_CHECKING:  # only a type here, as in bounds
    from fedowen_strategy.replies import ClientUpdate


@dataclass
class CappedStatistics:
    """Updates after the statistics cap (same order), the cap (None: nothing moved, or no
    statistics, or off) and the factor applied per capped client."""

    updates: list[ClientUpdate]
    cap: float | None = None
    capped: dict[str, float] = field(default_factory=dict)


def statistics_keys(reference: Mapping[str, NDArray]) -> list[str]:
    """Keys of ``reference``'s floating normalisation statistics (empty for, e.g., LeNet)."""
    return [k for k, v in reference.items()
            if k.endswith(STATISTICS) and np.issubdtype(np.asarray(v).dtype, np.floating)]


def statistics_norm(state: Mapping[str, NDArray], reference: Mapping[str, NDArray],
                    keys: Sequence[str] | None = None) -> float:
    """L2 norm of ``state - reference`` over the statistics ``keys`` (default: all of the
    reference's), in float64, accumulated array by array."""
    keys = statistics_keys(reference) if keys is None else keys
    total = 0.0
    for key in keys:
        delta = np.asarray(state[key], np.float64) - np.asarray(reference[key], np.float64)
        total += float(np.sum(np.square(delta)))
    return float(np.sqrt(total))


def shrink_statistics(state: Mapping[str, NDArray], reference: Mapping[str, NDArray],
                      factor: float, keys: Sequence[str]) -> dict[str, NDArray]:
    """``state`` with its statistics ``keys`` at ``reference + factor x (state - reference)``
    (the reference's dtype), every other array as it is."""
    out = dict(state)
    for key in keys:
        ref = np.asarray(reference[key])
        delta = np.asarray(state[key], np.float64) - ref
        out[key] = (ref.astype(np.float64) + factor * delta).astype(ref.dtype)
    return out


def cap_statistics(updates: Sequence[ClientUpdate], reference: Mapping[str, NDArray],
                   multiple: float) -> CappedStatistics:
    """Cap each update's statistics deviation at ``multiple`` x the round's lower-median one
    (module docstring). ``multiple <= 0`` (off), no updates or no statistics in the model:
    the updates come back as they are (the same objects) and the cap is None."""
    keys = statistics_keys(reference)
    if multiple <= 0 or not updates or not keys:
        return CappedStatistics(list(updates))
    norms = [statistics_norm(u.state, reference, keys) for u in updates]
    median = lower_median(norms)
    if median is None:  # nobody's statistics moved: nothing to cap
        return CappedStatistics(list(updates))
    cap = multiple * median
    out = CappedStatistics([], cap=cap)
    for upd, norm in zip(updates, norms, strict=True):
        if norm <= cap:
            out.updates.append(upd)
            continue
        factor = cap / norm
        out.capped[upd.client_id] = factor
        out.updates.append(replace(upd, state=shrink_statistics(upd.state, reference, factor,
                                                                keys)))
    return out
