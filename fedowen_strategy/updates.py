"""The one owner of an update vector: a model state, its update keys, and its deltas.

A client's *update* is ``d = W_i - W`` over the global model's **update keys**: its floating
arrays except normalisation statistics. Every module that measures, compares or moves updates
(the guards, the links, the copies check, the peer defences, the omniscient attacks of
``server_app.byzantine``) reads them through these functions, so the key rule and the
arithmetic are one.

**The arithmetic is the model's own float type** (:func:`work_dtype`: float32 for every
built-in model; at least float32, a float64 model stays float64), not a float64 copy of every
update (issue 70: on 10 ResNet-18 replies the float64 copies were most of the server's
non-valuation time, benchmarks/bench_server_numpy.py). Where float32 would lose precision the
sums are arranged so it does not, each in a stated way:

* a norm (:func:`update_norm`, :func:`vector_norm`) sums an array's float32 squares pairwise
  (numpy's pairwise summation) and the arrays' sums in float64: within 1e-8 (relative) of the
  float64 norm on ResNet-18's 11.2M entries, where one BLAS ``sdot`` per array was 3e-6 off;
* a combination of states (:func:`combine`: the aggregate, a clipped update, a linked group's
  mean) is summed as a step from a base state, ``base + sum_i w_i (a_i - base)``: the steps
  are small beside the weights, so their float32 rounding sits far below the last place of
  the result, which is rounded once, as the float64 sum cast back to float32 was;
* a Gram matrix (:func:`gram_matrix`, the cosines) is a float32 matrix product per array,
  the arrays' products summed in float64: its diagonal 7e-7 (relative) off the float64 one on
  ResNet-18, which the cosines' link threshold (0.98) does not feel. The copies check does
  not read it (:func:`fedowen_strategy.defences.links.duplicate_groups`).

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

from collections.abc import Iterable, Iterator, Mapping, Sequence

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


def work_dtype(*arrays: NDArray) -> np.dtype:
    """The float type update arithmetic on floating ``arrays`` runs in: their widest, at least
    float32 (a float16 update is summed in float32; a float64 model stays float64)."""
    return np.result_type(np.float32, *(np.asarray(a).dtype for a in arrays))


def flatten(state: State, keys: Sequence[str]) -> NDArray[np.floating]:
    """The arrays ``keys`` of ``state`` as one vector in their :func:`work_dtype` (empty
    without keys)."""
    if not keys:
        return np.zeros(0, np.float32)
    arrays = [np.asarray(state[k]) for k in keys]
    return np.concatenate([a.ravel() for a in arrays], dtype=work_dtype(*arrays))


def flat_delta(state: State, reference: State, keys: Sequence[str] | None = None
               ) -> NDArray[np.floating]:
    """``state - reference`` over ``keys`` (default: the reference's update keys) as one vector
    in their :func:`work_dtype`."""
    keys = update_keys(reference) if keys is None else keys
    return flat_deltas([state], reference, keys)[0] if keys else np.zeros(0, np.float32)


def flat_deltas(states: Sequence[State], reference: State, keys: Sequence[str] | None = None
                ) -> NDArray[np.floating]:
    """``(n, d)``: each state's update to ``reference`` over ``keys`` (default: the reference's
    update keys), one per row, in their :func:`work_dtype`, written in place (no
    intermediate copies); ``(0, 0)`` for no states."""
    if not states:
        return np.zeros((0, 0), np.float32)
    keys = update_keys(reference) if keys is None else keys
    dtype = work_dtype(*(reference[k] for k in keys), *(s[k] for s in states for k in keys))
    out = np.empty((len(states), sum(np.asarray(reference[k]).size for k in keys)), dtype)
    start = 0
    for key in keys:
        ref = np.asarray(reference[key]).reshape(-1)
        for row, state in zip(out, states, strict=True):
            np.subtract(np.asarray(state[key]).reshape(-1), ref, out=row[start:start + ref.size],
                        dtype=dtype)
        start += ref.size
    return out


def apply_delta(reference: State, delta: NDArray[np.floating], keys: Sequence[str],
                others: State | None = None) -> dict[str, NDArray]:
    """``reference + delta`` on the arrays ``keys`` (``delta`` flat over them, added in their
    :func:`work_dtype`, each array's dtype kept); every other array from ``others`` (as it is),
    or a copy of the reference's when ``others`` is None. Key order is the reference's."""
    out = {k: others[k] if others is not None else np.array(v, copy=True)
           for k, v in reference.items()}
    start = 0
    for key in keys:
        ref = np.asarray(reference[key])
        part = delta[start:start + ref.size].reshape(ref.shape)
        out[key] = np.add(ref, part, dtype=work_dtype(ref, part)).astype(ref.dtype, copy=False)
        start += ref.size
    return out


def combine(base: NDArray, arrays: Sequence[NDArray],
            weights: Sequence[float] | NDArray[np.floating], base_weight: float = 1.0) -> NDArray:
    """``base_weight * base + sum_i weights[i] * (arrays[i] - base)`` in the arrays'
    :func:`work_dtype`, in ``base``'s dtype and shape.

    Summed as a step from ``base`` (module docstring): with ``base_weight = 1`` this is ``base``
    moved by the weighted updates, and for weights summing to 1 and ``base_weight = 1`` it is
    their weighted average. An array that *is* ``base`` adds nothing and is skipped.
    """
    base = np.asarray(base)
    dtype = work_dtype(base, *arrays)
    step: NDArray | None = None
    term = None
    for weight, array in zip(weights, arrays, strict=True):
        if array is base or weight == 0:
            continue
        if step is None:  # the first term is the sum so far
            step = np.subtract(array, base, dtype=dtype)
            step *= dtype.type(weight)
            continue
        term = np.empty(base.shape, dtype) if term is None else term
        np.subtract(array, base, out=term, dtype=dtype)
        term *= dtype.type(weight)
        step += term
    if step is None:
        step = np.zeros(base.shape, dtype)
    if dtype.type(base_weight) == 1:
        step += base
    else:
        step += dtype.type(base_weight) * base
    return step.astype(base.dtype, copy=False)


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


def _squares(fresh: NDArray) -> float:
    """The sum of ``fresh``'s squares (squared in place: a temporary only), summed pairwise."""
    return float(np.sum(np.square(fresh, out=fresh)))


def _distances(pairs: Iterable[tuple[NDArray, NDArray]]) -> Iterator[float]:
    """Each pair's sum of squared differences, summed pairwise in their :func:`work_dtype`, the
    differences written into one scratch buffer (no fresh temporary per array)."""
    scratch = np.empty(0, np.float32)
    for a, b in pairs:
        a, b = np.asarray(a), np.asarray(b)
        dtype = work_dtype(a, b)
        if scratch.size < a.size or scratch.dtype != dtype:
            scratch = np.empty(max(a.size, scratch.size), dtype)
        diff = scratch[:a.size].reshape(a.shape)
        np.subtract(a, b, out=diff, dtype=dtype)
        yield _squares(diff)


def update_norm(state: State, reference: State) -> float:
    """L2 norm of ``state - reference`` over the update keys (buffers are ignored), each
    array's squares summed pairwise in its :func:`work_dtype`, the arrays' in float64 (module
    docstring)."""
    return float(np.sqrt(sum(_distances((state[k], ref) for k, ref in reference.items()
                                        if is_update(k, ref)))))


def model_norm(state: State) -> float:
    """L2 norm of ``state``'s update keys (the global model's size, for ``max-norm-ratio``),
    summed as :func:`update_norm` sums."""
    return float(np.sqrt(sum(_distances((arr, np.zeros((), np.asarray(arr).dtype))
                                        for key, arr in state.items() if is_update(key, arr)))))


def vector_norm(vector: NDArray[np.floating]) -> float:
    """L2 norm of a flat update (:func:`flat_delta`), summed as :func:`update_norm` sums
    (pairwise; float32 squares are not summed by one BLAS dot)."""
    return float(np.sqrt(_squares(np.array(vector, dtype=work_dtype(vector)))))


def within(state: State, other: State, reference: State, limit: float) -> bool:
    """Whether ``||state - other|| <= limit`` over ``reference``'s update keys (two updates'
    distance: the reference cancels), summed as :func:`update_norm` sums, array by array,
    stopping at the first array that puts the pair beyond ``limit``."""
    total, bound = 0.0, limit * limit
    for squares in _distances((state[k], other[k]) for k, ref in reference.items()
                              if is_update(k, ref)):
        total += squares
        if total > bound:
            return False
    return True


def cosines_to(deltas: NDArray[np.floating], direction: NDArray[np.floating]
               ) -> NDArray[np.float64]:
    """Each row of ``deltas`` against ``direction``: their cosine; 0 where either is zero. The
    inner products are one matrix-vector product in the vectors' dtype."""
    deltas = np.asarray(deltas)
    norms = np.array([vector_norm(row) for row in deltas])
    d_norm = vector_norm(direction)
    if d_norm == 0.0:
        return np.zeros(len(deltas))
    dots = (deltas @ np.asarray(direction, deltas.dtype)).astype(np.float64)
    return np.divide(dots, norms * d_norm, out=np.zeros(len(deltas)), where=norms > 0)


def gram_matrix(states: Sequence[State], reference: State) -> NDArray[np.float64]:
    """``(n, n)``: the inner products of the updates ``states[i] - reference`` (update keys),
    accumulated array by array in one reused buffer, so no flat copy of all updates is held:
    per array a matrix product in the :func:`work_dtype`, the arrays' sums in float64 (module
    docstring)."""
    n = len(states)
    gram = np.zeros((n, n))
    keys = [k for k, ref in reference.items() if is_update(k, ref)]
    if n == 0 or not keys:
        return gram
    dtype = work_dtype(*(reference[k] for k in keys), *(s[k] for s in states for k in keys))
    buffer = np.empty(n * max(np.asarray(reference[k]).size for k in keys), dtype)
    for key in keys:
        ref = np.asarray(reference[key]).reshape(-1)
        block = buffer[:n * ref.size].reshape(n, ref.size)
        for row, state in zip(block, states, strict=True):
            np.subtract(np.asarray(state[key]).reshape(-1), ref, out=row, dtype=dtype)
        gram += block @ block.T
    return gram


def row_gram(rows: NDArray[np.floating], chunk: int = 1 << 16) -> NDArray[np.float64]:
    """``(n, n)``: the inner products of the rows of a flat ``(n, d)`` block (FoolsGold's
    histories), in float64 from ``chunk`` columns at a time: float32 products are exact in
    float64, so it is the float64 Gram matrix without a float64 copy of the block."""
    rows = np.asarray(rows)
    gram = np.zeros((len(rows), len(rows)))
    for start in range(0, rows.shape[1] if rows.ndim == 2 else 0, chunk):
        part = rows[:, start:start + chunk].astype(np.float64)
        gram += part @ part.T
    return gram


def gram_cosines(gram: NDArray[np.float64]) -> NDArray[np.float64]:
    """Pairwise cosines from a Gram matrix; a zero vector has cosine 0 with everyone."""
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    scale = np.where(norms > 0, norms, 1.0)
    cos = gram / scale[:, None] / scale[None, :]
    cos[norms == 0, :] = 0.0
    cos[:, norms == 0] = 0.0
    return np.clip(cos, -1.0, 1.0)


def cosine_matrix(states: Sequence[State], reference: State,
                  gram: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
    """Pairwise cosine similarities of the updates ``states[i] - reference`` (update keys),
    from their :func:`gram_matrix` (computed unless given); a zero update has cosine 0 with
    everyone."""
    return gram_cosines(gram_matrix(states, reference) if gram is None else gram)
