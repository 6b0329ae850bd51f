"""The one owner of an update vector: a model state, its floating keys, and its deltas.

A client's *update* is ``d = W_i - W`` over the global model's floating arrays only: integer
buffers (BatchNorm's ``num_batches_tracked``) are counters, not directions, and are never part
of it. Every module that measures, compares or moves updates (the guards, the links, the
copies check, the peer defences, the omniscient attacks of ``server_app.byzantine``) reads
them through these functions, so the key rule and the float64 arithmetic are one.

Two norms live here on purpose: :func:`update_norm` sums each array's squares in turn (the
guards' norm, accumulated array by array so no flat copy is held), while a caller holding a
flat vector takes ``numpy.linalg.norm`` of it. They agree to the last few bits, not to the
last bit, and each caller keeps the one it has always used, so recorded runs stay identical.

**The rule for a model's buffers** (every strategy of the app follows it: FedOwen, Flower's
strategies through :func:`restore_counters`, the peer defences through
:func:`average_counters`):

* floating buffers (BatchNorm's ``running_mean`` / ``running_var``) are part of the update and
  are aggregated exactly as the parameters are, with the same weights (and through a server
  optimiser such as FedAvgM's momentum where the strategy has one);
* integer buffers (BatchNorm's ``num_batches_tracked``: a count of training steps, read only
  when ``momentum=None``) are the same weighted average of the accepted clients' counters,
  the weights normalised to sum 1, rounded to the nearest integer, in the global model's dtype
  and shape (0-d stays 0-d). They are never part of an update vector, a norm or a cosine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

#: A model state: array name -> array (a Flower ``ArrayRecord`` decoded, or a torch state
#: dict as numpy), in the model's key order.
State = Mapping[str, NDArray]


def float_keys(state: State) -> list[str]:
    """Keys of the floating arrays (integer counters such as BatchNorm's are not updates)."""
    return [k for k, v in state.items() if np.issubdtype(v.dtype, np.floating)]


def flatten(state: State, keys: Sequence[str]) -> NDArray[np.float64]:
    """The arrays ``keys`` of ``state`` as one float64 vector (empty without keys)."""
    if not keys:
        return np.zeros(0)
    return np.concatenate([np.asarray(state[k], np.float64).ravel() for k in keys])


def flat_delta(state: State, reference: State, keys: Sequence[str] | None = None
               ) -> NDArray[np.float64]:
    """``state - reference`` over ``keys`` (default: the reference's floating keys) as one
    float64 vector."""
    keys = float_keys(reference) if keys is None else keys
    return np.concatenate([(np.asarray(state[k], np.float64) - reference[k]).ravel()
                           for k in keys]) if keys else np.zeros(0)


def flat_deltas(states: Sequence[State], reference: State) -> NDArray[np.float64]:
    """``(n, d)``: each state's update to ``reference`` (:func:`flat_delta`), one per row;
    ``(0, 0)`` for no states."""
    if not states:
        return np.zeros((0, 0))
    keys = float_keys(reference)
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


def average_counters(states: Sequence[State], weights: NDArray[np.float64],
                     reference: State) -> dict[str, NDArray]:
    """The integer arrays of the aggregate under the module's buffer rule: the ``weights``
    (normalised to sum 1) average of ``states``' counters, rounded, in ``reference``'s dtype and
    shape; the reference's own counters where the weights sum to 0 (nobody to average)."""
    w = np.asarray(weights, dtype=np.float64)
    if len(states) != w.size:
        raise ValueError(f"got {len(states)} states but {w.size} weights")
    total = float(w.sum())
    out: dict[str, NDArray] = {}
    for key in counter_keys(reference):
        ref = np.asarray(reference[key])
        if not total > 0:
            out[key] = ref.copy()
            continue
        acc = sum((wi / total * np.asarray(s[key], np.float64) for wi, s in zip(w, states,
                                                                             strict=True)),
                  np.zeros(ref.shape))
        out[key] = np.asarray(np.rint(acc), dtype=ref.dtype).reshape(ref.shape)
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
    """L2 norm of ``state - reference`` over the floating arrays (counters are ignored),
    accumulated array by array."""
    total = 0.0
    for key, ref in reference.items():
        if np.issubdtype(ref.dtype, np.floating):
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


def cosine_matrix(states: Sequence[State], reference: State) -> NDArray[np.float64]:
    """Pairwise cosine similarities of the updates ``states[i] - reference`` (floating arrays),
    accumulated array by array so no flat copy of all updates is held; a zero update has
    cosine 0 with everyone."""
    n = len(states)
    gram = np.zeros((n, n))
    for key, ref in reference.items():
        if not np.issubdtype(ref.dtype, np.floating) or n == 0:
            continue
        block = np.stack([(np.asarray(s[key], np.float64) - ref).ravel() for s in states])
        gram += block @ block.T
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    scale = np.where(norms > 0, norms, 1.0)
    cos = gram / scale[:, None] / scale[None, :]
    cos[norms == 0, :] = 0.0
    cos[:, norms == 0] = 0.0
    return np.clip(cos, -1.0, 1.0)
