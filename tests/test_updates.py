"""The update vector's one owner (fedowen_strategy.updates): keys, flatten, apply, norm, cosine."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.updates import (
    apply_delta,
    cosine_matrix,
    flat_delta,
    flat_deltas,
    flatten,
    update_keys,
    update_norm,
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
    assert flat_delta(STATE, REF).dtype == np.float64
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
    assert update_norm(big, ref) == pytest.approx(float(np.linalg.norm(flat_delta(big, ref))),
                                                  rel=1e-12)


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
