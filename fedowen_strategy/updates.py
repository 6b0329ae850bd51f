"""The one owner of an update vector: a model state, its update keys, and its deltas.

A client's *update* is ``d = W_i - W`` over the global model's **update keys**: its floating
arrays except normalisation statistics. Every module that measures, compares or moves updates
(the guards, the links, the copies check, the peer defences, the omniscient attacks of
``server_app.byzantine``) reads them through these functions, so the key rule and the float64
arithmetic are one.

Two norms live here on purpose: :func:`update_norm` sums each array's squares in turn (the
guards' norm, accumulated array by array so no flat copy is held), while a caller holding a
flat vector takes ``numpy.linalg.norm`` of it. They agree to the last few bits, not to the
last bit, and each caller keeps the one it has always used, so recorded runs stay identical.

**The rule for a model's buffers** (one rule for FedOwen, Flower's strategies through
:func:`restore_counters`, and the peer defences through :func:`average_buffers`):

* normalisation statistics (floating arrays named ``*running_mean`` / ``*running_var``, as
  every torch BatchNorm and InstanceNorm layer names them) are **not part of the update**: no
  norm, cosine, clip, bound or vote reads them, and a clipped update keeps the statistics its
  client sent. Measured (ResNet-18, CIFAR-10, one local epoch from the initial model): the
  statistics moved by 27-183 in L2 against 4.5-7.3 for the parameters, so in the update they
  would decide every norm-based guard alone. A reply with a negative running variance is
  rejected (:func:`fedowen_strategy.replies.parse_replies`). The aggregate's statistics are,
  by default (``statistics-rule = "median"``), the coordinate-wise **weighted median** of the
  clients' under the round's aggregation weights (:mod:`fedowen_strategy.defences.statistics`:
  one client in ten sending ``running_var`` 1e6 moves it no further than an honest client
  could; docs/results/statistics-guard/), in FedOwen, in Flower's strategies as the ServerApp
  wraps them (weights: num-examples) and in the peers (their weights) alike; the functions
  here average them (``statistics-rule = "mean"``, the rule before issue 70; the valuation's
  coalition models too), and the opt-in ``statistics-cap`` bounds each client's deviation
  first;
* integer buffers (BatchNorm's ``num_batches_tracked``: a count of training steps, read only
  when ``momentum=None``) are the same weighted average of the clients' counters, rounded to
  the nearest integer, in the global model's dtype and shape (0-d stays 0-d);
* every other floating buffer of a user's network is treated as a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from fedowen_task.protocol import NORM_STATISTICS

#: A model state: array name -> array (a Flower ``ArrayRecord`` decoded, or a torch state
#: dict as numpy), in the model's key order.
State = Mapping[str, NDArray]


#: Name endings of normalisation statistics (torch's ``_NormBase`` buffers).
STATISTICS = NORM_STATISTICS


def is_update(key: str, array: NDArray) -> bool:
    """Whether ``key`` is part of an update: floating and not a normalisation statistic."""
    return np.issubdtype(np.asarray(array).dtype, np.floating) and not key.endswith(STATISTICS)


def update_keys(state: State) -> list[str]:
    """Keys of the update: floating arrays but normalisation statistics (module docstring)."""
    return [k for k, v in state.items() if is_update(k, v)]


def flatten(state: State, keys: Sequence[str]) -> NDArray[np.float64]:
    """The arrays ``keys`` of ``state`` as one float64 vector (empty without keys)."""
    if not keys:
        return np.zeros(0)
    return np.concatenate([np.asarray(state[k], np.float64).ravel() for k in keys])


def flat_delta(state: State, reference: State, keys: Sequence[str] | None = None
               ) -> NDArray[np.float64]:
    """``state - reference`` over ``keys`` (default: the reference's floating keys) as one
    float64 vector."""
    keys = update_keys(reference) if keys is None else keys
    return np.concatenate([(np.asarray(state[k], np.float64) - reference[k]).ravel()
                           for k in keys]) if keys else np.zeros(0)


def flat_deltas(states: Sequence[State], reference: State) -> NDArray[np.float64]:
    """``(n, d)``: each state's update to ``reference`` (:func:`flat_delta`), one per row;
    ``(0, 0)`` for no states."""
    if not states:
        return np.zeros((0, 0))
    keys = update_keys(reference)
    return np.stack([flat_delta(s, reference, keys) for s in states])


def apply_delta(reference: State, delta: NDArray[np.float64], keys: Sequence[str],
                others: State | None = None) -> dict[str, NDArray]:
    """``reference + delta`` on the arrays ``keys`` (``delta`` flat over them, added in float64,
    each array's dtype kept); every other array from ``others`` (as it is), or a copy of the
    reference's when ``others`` is None. Key order is the reference's."""
    out = {k: others[k] if others is not None else np.array(v, copy=True)
           for k, v in reference.items()}
    start = 0
    for key in keys:
        ref = reference[key]
        part = delta[start:start + ref.size].reshape(ref.shape)
        out[key] = (ref.astype(np.float64) + part).astype(ref.dtype)
        start += ref.size
    return out


def counter_keys(state: State) -> list[str]:
    """Keys of the integer arrays (counters such as BatchNorm's ``num_batches_tracked``)."""
    return [k for k, v in state.items() if np.issubdtype(np.asarray(v).dtype, np.integer)]


def buffer_keys(state: State) -> list[str]:
    """Keys outside the update: normalisation statistics and counters."""
    return [k for k, v in state.items()
            if not is_update(k, v) and np.issubdtype(np.asarray(v).dtype, np.number)]


def average_buffers(states: Sequence[State], weights: NDArray[np.float64],
                    reference: State) -> dict[str, NDArray]:
    """The buffers of the aggregate under the module's rule: the ``weights`` (normalised to sum
    1) average of ``states``' statistics and counters (counters rounded), in ``reference``'s
    dtype and shape; the reference's own buffers where the weights sum to 0 (nobody to
    average)."""
    w = np.asarray(weights, dtype=np.float64)
    if len(states) != w.size:
        raise ValueError(f"got {len(states)} states but {w.size} weights")
    total = float(w.sum())
    out: dict[str, NDArray] = {}
    for key in buffer_keys(reference):
        ref = np.asarray(reference[key])
        if not total > 0:
            out[key] = ref.copy()
            continue
        acc = np.zeros(ref.shape)
        for wi, state in zip(w, states, strict=True):
            acc += wi / total * np.asarray(state[key], np.float64)
        if np.issubdtype(ref.dtype, np.integer):
            acc = np.rint(acc)
        out[key] = np.asarray(acc, dtype=ref.dtype).reshape(ref.shape)
    return out


def restore_counters(aggregate: State, reference: State) -> dict[str, NDArray]:
    """``aggregate`` with its integer entries put back into ``reference``'s dtype and shape,
    rounded to the nearest integer: Flower's ``aggregate_arrayrecords`` multiplies every array
    by a float weight, so its ``num_batches_tracked`` comes back as a fractional float64 (the
    same weighted average the rule asks for, in the wrong type)."""
    out = {k: np.asarray(v) for k, v in aggregate.items()}
    for key in counter_keys(reference):
        if key in out:
            ref = np.asarray(reference[key])
            out[key] = np.asarray(np.rint(out[key]), dtype=ref.dtype).reshape(ref.shape)
    return out


def update_norm(state: State, reference: State) -> float:
    """L2 norm of ``state - reference`` over the update keys (buffers are ignored),
    accumulated array by array."""
    total = 0.0
    for key, ref in reference.items():
        if is_update(key, ref):
            total += float(np.sum(np.square(state[key].astype(np.float64) - ref)))
    return float(np.sqrt(total))


def cosines_to(deltas: NDArray[np.float64], direction: NDArray[np.float64]
               ) -> NDArray[np.float64]:
    """Each row of ``deltas`` against ``direction``: their cosine; 0 where either is zero."""
    norms = np.linalg.norm(deltas, axis=1)
    d_norm = float(np.linalg.norm(direction))
    if d_norm == 0.0:
        return np.zeros(len(deltas))
    return np.divide(deltas @ direction, norms * d_norm, out=np.zeros(len(deltas)),
                     where=norms > 0)


def gram_matrix(states: Sequence[State], reference: State) -> NDArray[np.float64]:
    """``(n, n)``: the inner products of the updates ``states[i] - reference`` (update keys),
    accumulated array by array in one reused buffer, so no flat copy of all updates is held
    (on ResNet-18 a fresh ``(n, size)`` block per array was most of the time)."""
    n = len(states)
    gram = np.zeros((n, n))
    keys = [k for k, ref in reference.items() if is_update(k, ref)]
    if n == 0 or not keys:
        return gram
    buffer = np.empty(n * max(np.asarray(reference[k]).size for k in keys))
    for key in keys:
        ref = np.asarray(reference[key]).reshape(-1)
        block = buffer[:n * ref.size].reshape(n, ref.size)
        for row, state in zip(block, states, strict=True):
            np.subtract(np.asarray(state[key]).reshape(-1), ref, out=row, dtype=np.float64)
        gram += block @ block.T
    return gram


def cosine_matrix(states: Sequence[State], reference: State,
                  gram: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
    """Pairwise cosine similarities of the updates ``states[i] - reference`` (update keys),
    from their :func:`gram_matrix` (computed unless given); a zero update has cosine 0 with
    everyone."""
    gram = gram_matrix(states, reference) if gram is None else gram
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    scale = np.where(norms > 0, norms, 1.0)
    cos = gram / scale[:, None] / scale[None, :]
    cos[norms == 0, :] = 0.0
    cos[:, norms == 0] = 0.0
    return np.clip(cos, -1.0, 1.0)
