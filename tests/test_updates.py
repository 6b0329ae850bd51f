"""The update vector's one owner (fedowen_strategy.updates): keys, flatten, apply, norm, cosine."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.updates import (
    apply_delta,
    combine,
    cosine_matrix,
    flat_delta,
    flat_deltas,
    flatten,
    update_keys,
    update_norm,
    within,
)

# a float32 weight, an integer counter between two float arrays, a float64 bias
REF = {"w": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), "n": np.array([7], np.int64),
       "b": np.array([0.5], np.float64)}
STATE = {"w": np.array([[1.0, 2.0], [3.0, 7.0]], np.float32), "n": np.array([9], np.int64),
         "b": np.array([4.5], np.float64)}


def test_the_update_is_the_floating_arrays_only_in_key_order() -> None:
    # Execute / Assert: the counter is no part of the update; w's 4 entries, then b's
    assert update_keys(REF) == ["w", "b"]
    np.testing.assert_array_equal(flatten(REF, ["w", "b"]), [1.0, 2.0, 3.0, 4.0, 0.5])
    np.testing.assert_array_equal(flat_delta(STATE, REF), [0.0, 0.0, 0.0, 3.0, 4.0])
    assert flat_delta(STATE, REF).dtype == np.float64  # b is float64: the widest float
    assert flat_delta(STATE, REF, ["w"]).dtype == np.float32  # a float32 model stays float32
    assert flatten(REF, []).shape == (0,) and flat_delta(STATE, REF, []).shape == (0,)


def test_flat_deltas_stacks_one_row_per_state() -> None:
    out = flat_deltas([STATE, REF], REF)
    np.testing.assert_array_equal(out, [[0.0, 0.0, 0.0, 3.0, 4.0], [0.0] * 5])
    assert flat_deltas([], REF).shape == (0, 0)


def test_apply_delta_inverts_flat_delta_and_takes_counters_from_others() -> None:
    # Prepare
    delta = flat_delta(STATE, REF)
    # Execute
    kept = apply_delta(REF, delta, update_keys(REF))
    theirs = apply_delta(REF, delta, update_keys(REF), others=STATE)
    # Assert: floats restored in their own dtype; the counter copied from the reference by
    # default, taken from ``others`` (the sender's own) when given
    for out in (kept, theirs):
        assert list(out) == ["w", "n", "b"]
        assert out["w"].dtype == np.float32 and out["w"].tobytes() == STATE["w"].tobytes()
        np.testing.assert_array_equal(out["b"], STATE["b"])
    assert kept["n"].tolist() == [7] and kept["n"] is not REF["n"]
    assert theirs["n"] is STATE["n"]


def test_update_norm_agrees_with_the_flat_vectors_norm() -> None:
    # Execute / Assert: ||(0, 0, 0, 3, 4)|| = 5, the counter ignored
    assert update_norm(STATE, REF) == 5.0
    rng = np.random.default_rng(0)
    big = {"w": rng.normal(size=(30, 40)).astype(np.float32), "b": rng.normal(size=9)}
    ref = {k: np.zeros_like(v) for k, v in big.items()}
    # w's squares are float32 (within a float32 rounding of the float64 norm), b's float64
    exact = float(np.linalg.norm(np.concatenate([big["w"].ravel().astype(np.float64),
                                                 big["b"]])))
    assert update_norm(big, ref) == pytest.approx(exact, rel=1e-7)


def test_cosine_matrix_by_hand() -> None:
    # Prepare: updates (1, 0), (1, 1), (-2, 0) and a zero update
    ref = {"x": np.zeros(2, np.float32), "n": np.array([0])}
    states = [{"x": np.array(v, np.float32), "n": np.array([5])}
              for v in ([1, 0], [1, 1], [-2, 0], [0, 0])]
    # Execute
    cos = cosine_matrix(states, ref)
    # Assert: cos 45 degrees, opposite directions, and the zero update cosine 0 with everyone
    h = 1 / np.sqrt(2)
    np.testing.assert_allclose(cos, [[1, h, -1, 0], [h, 1, -h, 0], [-1, -h, 1, 0],
                                     [0, 0, 0, 0]], atol=1e-12)


def test_combine_is_a_step_from_the_base_in_the_arrays_dtype() -> None:
    # Prepare: base 1, arrays 2 and 5 (float32), weights 0.5 and 0.25
    base = np.array([1.0, 1.0], np.float32)
    arrays = [np.array([2.0, 2.0], np.float32), np.array([5.0, 1.0], np.float32)]
    # Execute
    moved = combine(base, arrays, [0.5, 0.25])
    averaged = combine(base, [base, *arrays], [0.25, 0.5, 0.25], base_weight=1.0)
    halved = combine(base, arrays[:1], [0.5], base_weight=0.5)
    # Assert: 1 + 0.5 (2 - 1) + 0.25 (5 - 1) = 2.5 and 1 + 0.5 (2 - 1) + 0.25 (1 - 1) = 1.5;
    # weights 1/4, 1/2, 1/4 average 1, 2, 5 to 2.5 (the base's own term adds nothing);
    # 0.5 x 1 + 0.5 (2 - 1) = 1; the base's dtype kept
    assert moved.tolist() == [2.5, 1.5] and moved.dtype == np.float32
    assert averaged.tolist() == [2.5, 1.5]
    assert halved.tolist() == [1.0, 1.0]


def test_combine_matches_the_float64_sum_rounded_once() -> None:
    # Prepare: 10 float32 states near a base (updates 1% of the weights), softmax-like weights
    rng = np.random.default_rng(0)
    base = rng.normal(size=20_000).astype(np.float32)
    states = [base + rng.normal(0, 0.01, base.size).astype(np.float32) for _ in range(10)]
    weights = rng.dirichlet(np.ones(10))
    # Execute
    got = combine(base, states, weights, base_weight=1.0)
    exact = (sum(w * s.astype(np.float64) for w, s in zip(weights, states, strict=True))
             + (1.0 - weights.sum()) * base).astype(np.float32)
    # Assert: nearly every entry the same bits as the float64 sum rounded once; every entry
    # within 2 units in the last place of |base| + sum_i w_i |s_i - base| (measured: 98.4%
    # the same, at most 1.5 units off; near 0 the steps' own rounding shows)
    size = np.abs(base) + sum(w * np.abs(s.astype(np.float64) - base)
                              for w, s in zip(weights, states, strict=True))
    assert np.mean(got == exact) > 0.95
    assert np.all(np.abs(got.astype(np.float64) - exact)
                  <= 2 * np.spacing(size.astype(np.float32)))


def test_within_stops_at_the_first_array_beyond_the_limit() -> None:
    # Prepare: two states 3 apart in "a" and 4 apart in "b" (distance 5); a counter between
    ref = {"a": np.zeros(1, np.float32), "n": np.array([0]), "b": np.zeros(1, np.float32)}
    x = {"a": np.array([3.0], np.float32), "n": np.array([1]), "b": np.array([4.0], np.float32)}
    y = {"a": np.zeros(1, np.float32), "n": np.array([9]), "b": np.zeros(1, np.float32)}
    # Execute / Assert: 5 <= 5, not <= 4.99; beyond 2 after "a" already
    assert within(x, y, ref, 5.0) and not within(x, y, ref, 4.99)
    assert not within(x, y, ref, 2.0)
