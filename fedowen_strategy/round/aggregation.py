"""Contribution-aware aggregation (FedOwen paper, Sec. 3.5).

The new global model is ``W = sum_i alpha_i W_i`` over the clients that returned an update this
round. FedOwen's ``alpha`` is ``softmax(phi / T)``; the ``aggregation`` axis also offers
``softmax-spread``, the same with ``T`` set on phi's own scale each round (the temperature times
the round's standard deviation of phi: issue 72, the valuation's verdict acted on), FedAvg's
``n_i / sum n`` (``examples``) and equal weights (``uniform``), so each ablation changes one
choice only. Arrays are plain ``dict[str, numpy.ndarray]`` (one state dict per
client); no Flower or torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.updates import State, average_buffers, combine

#: How a round's updates are weighted: softmax(phi / T), softmax over the updates with
#: phi > 0 only (the others get 0), softmax(phi / (T sd(phi))), FedAvg's num-examples, equal.
AGGREGATIONS = ("softmax", "positive", "softmax-spread", "examples", "uniform")
#: The aggregations that need contributions phi.
NEEDS_PHI = ("softmax", "positive", "softmax-spread")
#: A round's phi whose standard deviation lies below this does not spread: equal weights.
FLAT_SPREAD = 1e-9


def softmax_weights(phi: NDArray[np.float64], temperature: float = 1.0) -> NDArray[np.float64]:
    """Numerically stable ``softmax(phi / temperature)``.

    Raises
    ------
    ValueError
        If ``temperature`` is not positive or ``phi`` holds NaN/Inf.
    """
    if not temperature > 0.0 or not np.isfinite(temperature):
        raise ValueError(f"temperature={temperature!r} must be a finite number > 0")
    phi = np.asarray(phi, dtype=np.float64)
    if phi.size == 0:
        raise ValueError("softmax_weights needs at least one contribution")
    if not np.all(np.isfinite(phi)):
        raise ValueError(f"contributions must be finite to weight an aggregate, got {phi}")
    z = phi / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def spread_weights(phi: NDArray[np.float64], multiple: float = 1.0) -> NDArray[np.float64]:
    """``softmax(phi / T)`` with ``T = multiple x sd(phi)``, the round's population standard
    deviation: the weights are ``softmax`` of phi's z-scores over ``multiple``, so they move
    with the round's own differences, whatever phi's units (at ``multiple`` 1 a client one
    standard deviation below another weighs ``e^-1`` of it). A round whose phi do not spread
    (sd below :data:`FLAT_SPREAD`, one update included) gets equal weights."""
    phi = np.asarray(phi, dtype=np.float64)
    if not multiple > 0.0 or not np.isfinite(multiple):
        raise ValueError(f"temperature={multiple!r} (the multiple of phi's spread) must be a "
                         "finite number > 0")
    if phi.size == 0 or not np.all(np.isfinite(phi)):
        return softmax_weights(phi)  # refuses them, naming what is wrong
    spread = float(np.std(phi))
    if spread < FLAT_SPREAD:
        return uniform_weights(phi.size)
    return softmax_weights(phi, multiple * spread)


def example_weights(num_examples: Sequence[int]) -> NDArray[np.float64]:
    """FedAvg weights ``n_i / sum_j n_j``."""
    n = np.asarray(num_examples, dtype=np.float64)
    if n.size == 0 or np.any(n <= 0) or not np.all(np.isfinite(n)):
        raise ValueError(f"num-examples must be positive and finite, got {list(num_examples)}")
    return n / n.sum()


def uniform_weights(n: int) -> NDArray[np.float64]:
    """Equal weights ``1 / n``."""
    if n < 1:
        raise ValueError(f"uniform weights need at least one update, got n={n}")
    return np.full(n, 1.0 / n)


def round_weights(kind: str, phi: NDArray[np.float64], num_examples: Sequence[int],
                  temperature: float = 1.0) -> NDArray[np.float64]:
    """The aggregation weights of one round under aggregation ``kind`` (see AGGREGATIONS)."""
    if kind == "softmax":
        return softmax_weights(phi, temperature)
    if kind == "positive":
        phi = np.asarray(phi, dtype=np.float64)
        keep = phi > 0
        if not keep.any():  # nobody improved the utility: no evidence to weight by
            return uniform_weights(len(phi))
        out = np.zeros(len(phi))
        out[keep] = softmax_weights(phi[keep], temperature)
        return out
    if kind == "softmax-spread":
        return spread_weights(phi, temperature)
    if kind == "examples":
        return example_weights(num_examples)
    if kind == "uniform":
        return uniform_weights(len(num_examples))
    raise ValueError(f"aggregation={kind!r} is not one of {AGGREGATIONS}")


def mix_and_cap(weights: NDArray[np.float64], uniform_mix: float = 0.0,
                cap: float = 1.0) -> NDArray[np.float64]:
    """``(1 - uniform_mix) * weights + uniform_mix / n``, then no weight above ``cap``: the
    excess of capped weights goes to the others in proportion to their weights (equally when
    those are all 0), repeated until none exceeds the cap. A cap below ``1 / n`` cannot be met
    by any weights summing to 1; the weights are then uniform (the closest)."""
    w = np.asarray(weights, dtype=np.float64)
    if not 0.0 <= uniform_mix <= 1.0 or not 0.0 < cap <= 1.0:
        raise ValueError(f"uniform_mix={uniform_mix!r} must lie in [0, 1] and cap={cap!r} in "
                         "(0, 1]")
    n = w.size
    w = (1.0 - uniform_mix) * w + uniform_mix / n
    if cap * n <= 1.0 + 1e-12:
        return uniform_weights(n)
    fixed = np.zeros(n, dtype=bool)
    while (over := (w > cap + 1e-15) & ~fixed).any():
        excess = float((w[over] - cap).sum())
        w[over], fixed = cap, fixed | over
        free = ~fixed
        base = w[free].sum()
        w[free] += excess * (w[free] / base if base > 0 else 1.0 / free.sum())
    return w / w.sum()


def weighted_average(states: Sequence[State], weights: NDArray[np.float64]) -> dict[str, NDArray]:
    """Weighted sum ``sum_i w_i * states[i]`` key by key (weights must sum to 1).

    Floating arrays keep their dtype, summed in it as a step from ``states[0]``
    (:func:`fedowen_strategy.updates.combine`: ``W states[0] + sum_i w_i (states[i] -
    states[0])``, ``W`` the weights' sum); buffers (BatchNorm's running statistics and its
    ``num_batches_tracked``) follow the buffer rule of :mod:`fedowen_strategy.updates`: the same
    weighted average, counters rounded. Every array keeps its shape, 0-d included.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if len(states) != weights.size or weights.size == 0:
        raise ValueError(f"got {len(states)} states but {weights.size} weights")
    if not np.isclose(weights.sum(), 1.0, atol=1e-6):
        raise ValueError(f"aggregation weights must sum to 1, got {weights.sum():.6f}")
    buffers = average_buffers(states, weights, states[0])
    out: dict[str, NDArray] = {}
    for key, first in states[0].items():
        if key in buffers:
            out[key] = buffers[key]
            continue
        out[key] = combine(first, [state[key] for state in states], weights,
                           float(weights.sum()))
    return out


def step_average(states: Sequence[State], weights: NDArray[np.float64], reference: State
                 ) -> dict[str, NDArray]:
    """``reference + sum_i w_i (states[i] - reference)`` key by key: the weights need not sum
    to 1 (the reference keeps ``1 - sum w``), as an unbiased importance-weighted estimator of
    the average update asks (DELTA's). Equal to :func:`weighted_average` when they sum to 1.

    Buffers follow the buffer rule of :mod:`fedowen_strategy.updates` (the weights normalised
    to sum 1, counters rounded; the reference's own where they sum to 0); every other array
    keeps its dtype and shape.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if len(states) != weights.size or weights.size == 0:
        raise ValueError(f"got {len(states)} states but {weights.size} weights")
    if not np.all(np.isfinite(weights)):
        raise ValueError(f"step weights must be finite, got {weights}")
    buffers = average_buffers(states, weights, reference)
    out: dict[str, NDArray] = {}
    for key, ref in reference.items():
        if key in buffers:
            out[key] = buffers[key]
            continue
        out[key] = combine(ref, [state[key] for state in states], weights)
    return out
