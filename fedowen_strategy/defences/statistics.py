"""The rule for the normalisation statistics a client sends: their weighted median (the
default, ``statistics-rule``) and an opt-in bound (``statistics-cap``).

The update guards read only the update keys (:mod:`fedowen_strategy.updates`): BatchNorm's
running statistics (arrays named ``*running_mean`` / ``*running_var``) are not part of the
update and no norm measures them. Averaged with the aggregation weights, one client sending a
huge but valid ``running_var`` (1e6, say) at any weight w > 0 (FedOwen's softmax weights never
are 0) divides every normalised activation of the global model by about ``sqrt(w x 1e6)``:
the model is broken however tight the norm cap on its update.

**The rule** (``statistics-rule = "median"``, :func:`median_statistics`): each statistics
coordinate of the aggregate is the clients' weighted median under the round's aggregation
weights (:func:`weighted_median`: where the weights sorted by value reach half their total).
Clients holding less than half the weight cannot move it outside the range of the others'
values, coordinate by coordinate, so neither a huge variance nor one layer scaled alone
(which an L2 bound over the whole model lets through) gets in. FedOwen applies it when the
round averages (:func:`fedowen_strategy.round.round_step.aggregate_round`; the valuation's
coalition models still average what they hold, so an attacker's huge statistics lower its
own phi); Flower's strategies as the ServerApp wraps them (num-examples weights, replacing
Flower's own average, Krum's pick or FedMedian's median of them) and the peers (their
weights) through :func:`guard_statistics`. The round record says it acted:
``statistics_rule``, ``statistics_shift`` (L2 of the median minus the weighted mean) and
``statistics_farthest`` (the client farthest from the median, its distance, the median
distance). ``mean`` is the weighted mean (the rule before issue 70).

Measured (docs/results/statistics-guard/: CIFAR-10, 10 clients a round, a user's BatchNorm
network, 4 rounds, one client in ten attacking): with the mean, ``huge-statistics`` left a
layer's largest variance 2.8e5 x the clean run's and ``scaled-statistics`` (x4) 1.56 x; the
median held both to 1.19 x and 1.11 x, its own clean run at 1.11 x (the median is not the
mean of honest statistics); the cap at 3 (below) held them to 1.17 x and 1.22 x at no clean
cost there, the cap at 2 clipped honest clients in 2 of 4 clean rounds. The median is the
default because it needs no multiple and bounds each coordinate, not the model's L2 total.

**The cap** (opt-in, ``statistics-cap = multiple`` > 0, :func:`cap_statistics`): each
update's *statistics deviation* ``s_i = S_i - S`` (its statistics minus the global model's,
over every statistics array, in float64) is measured by its L2 norm, accumulated array by
array as :func:`fedowen_strategy.updates.update_norm` does, and capped at

    cap = multiple x lower_median({||s_j|| : ||s_j|| > 0})

(:func:`fedowen_strategy.defences.bounds.lower_median`: no attacker short of half of the round's
non-zero deviations moves it). A client above it sends ``S + s_i x cap / ||s_i||``: a convex
combination of its statistics and the global model's, so a variance stays non-negative. Its
update keys are untouched (the norm cap's business). FedOwen caps before it values (the
valued coalitions see the capped statistics); the others before the rule combines them. A
multiple below 1 caps the median client as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.bounds import lower_median
from fedowen_strategy.replies import ClientUpdate
from fedowen_strategy.updates import STATISTICS


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


#: How the aggregate combines the clients' statistics (``statistics-rule``).
STATISTICS_RULES = ("median", "mean")


def weighted_median(stack: NDArray, weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """Coordinate-wise weighted median of ``stack``'s rows (``(n, ...)``): per coordinate,
    the value where the weights sorted by value first reach half their total, averaged with
    the next value when they reach exactly half (equal weights: the ordinary median)."""
    values = np.asarray(stack, np.float64).reshape(len(stack), -1)
    w = np.asarray(weights, np.float64)
    if len(values) != w.size or not w.sum() > 0:
        raise ValueError(f"weighted_median needs one weight per row and a positive total, got "
                         f"{len(values)} rows and weights {w.tolist()}")
    order = np.argsort(values, axis=0, kind="stable")
    ranked = np.take_along_axis(values, order, axis=0)
    cum = np.cumsum(w[order], axis=0)
    half = 0.5 * float(w.sum())
    tol = 1e-12 * float(w.sum())
    low = np.argmax(cum >= half - tol, axis=0)
    high = np.argmax(cum > half + tol, axis=0)
    cols = np.arange(values.shape[1])
    median = 0.5 * (ranked[low, cols] + ranked[high, cols])
    return median.reshape(np.shape(stack)[1:])


@dataclass
class GuardedStatistics:
    """The aggregate's statistics under the rule (the keys of ``statistics_keys``, in the
    reference's dtype) and the round record's fields saying what the guard did."""

    statistics: dict[str, NDArray]
    record: dict[str, object]


def median_statistics(states: Sequence[Mapping[str, NDArray]], client_ids: Sequence[str],
                      weights: NDArray[np.float64], reference: Mapping[str, NDArray]
                      ) -> GuardedStatistics | None:
    """``statistics-rule = "median"``: each statistics array of the aggregate is the
    coordinate-wise :func:`weighted_median` of the clients' (weights: the round's aggregation
    weights); None without statistics or without positive weights (the caller keeps its
    own). The record: ``statistics_rule``, ``statistics_shift`` (L2 of the median minus the
    weighted mean: how far the guard moved the aggregate) and ``statistics_farthest`` (the
    client farthest from the median, its distance and the median client's distance)."""
    keys = statistics_keys(reference)
    w = np.asarray(weights, np.float64)
    if not keys or not states or not w.sum() > 0:
        return None
    out: dict[str, NDArray] = {}
    shift = 0.0
    for key in keys:
        stack = np.stack([np.asarray(s[key], np.float64) for s in states])
        median = weighted_median(stack, w)
        shift += float(np.sum(np.square(median - np.tensordot(w / w.sum(), stack, axes=1))))
        out[key] = median.astype(np.asarray(reference[key]).dtype)
    distances = [statistics_norm(s, out, keys) for s in states]
    far = int(np.argmax(distances))
    record: dict[str, object] = {
        "statistics_rule": "median", "statistics_shift": float(np.sqrt(shift)),
        "statistics_farthest": {"client": client_ids[far], "distance": distances[far],
                                "median_distance": float(np.median(distances))}}
    return GuardedStatistics(out, record)


def guard_statistics(states: Sequence[Mapping[str, NDArray]], client_ids: Sequence[str],
                     weights: NDArray[np.float64], reference: Mapping[str, NDArray], *,
                     rule: str, cap_multiple: float = 0.0) -> GuardedStatistics | None:
    """The statistics rule for a strategy that averages the statistics itself (Flower's, the
    peers'): each client's statistics capped (``cap_multiple`` > 0, :func:`cap_statistics`
    around ``reference``, the model sent), then combined by ``rule`` (``median``:
    :func:`median_statistics`; ``mean``: the weighted mean). None: nothing to do (no
    statistics, rule ``mean`` with no cap, or no positive weight): the caller's own stand."""
    keys = statistics_keys(reference)
    w = np.asarray(weights, np.float64)
    if not keys or not states or not w.sum() > 0 or (rule == "mean" and cap_multiple <= 0):
        return None
    record: dict[str, object] = {}
    if cap_multiple > 0:
        updates = [ClientUpdate(i, cid, dict(s), 1, 0.0)
                   for i, (cid, s) in enumerate(zip(client_ids, states, strict=True))]
        capped = cap_statistics(updates, reference, cap_multiple)
        states = [u.state for u in capped.updates]
        if capped.cap is not None:
            record.update(statistics_cap=capped.cap, statistics_capped=capped.capped)
    if rule == "median":
        median = median_statistics(states, client_ids, w, reference)
        assert median is not None  # keys, states and weights checked above
        median.record = {**record, **median.record}
        return median
    mean = {k: np.tensordot(w / w.sum(), np.stack([np.asarray(s[k], np.float64)
                                                   for s in states]), axes=1)
            .astype(np.asarray(reference[k]).dtype) for k in keys}
    return GuardedStatistics(mean, record)
