"""Robust update bounds: clip or reject beyond a multiple of the round's lower-median norm."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedowen_strategy.defences.bounds import bound_updates, round_bound
from fedowen_strategy.replies import ClientUpdate
from fedowen_strategy.updates import update_norm

REF = {"w": np.array([3.0, 4.0], np.float32), "n": np.array(7, np.int64)}


def upd(cid: str, dx: float, dy: float = 0.0, examples: int = 10) -> ClientUpdate:
    state = {"w": REF["w"] + np.array([dx, dy], np.float32), "n": np.array(9, np.int64)}
    return ClientUpdate(node_id=1, client_id=cid, state=state, num_examples=examples,
                        train_loss=0.0)


def test_update_norm_ignores_integer_counters() -> None:
    assert update_norm(upd("a", 3.0, 4.0).state, REF) == pytest.approx(5.0)


@pytest.mark.parametrize(("norms", "expected"), [
    ([1.0, 2.0, 40.0], 3 * 2.0),        # the median of three
    ([1.0, 40.0], 3 * 1.0),             # lower median: the honest one, not the midpoint 20.5
    ([0.0, 0.0, 1.0, 2.0], 3 * 1.0),    # zero updates (free riders) do not pull it to 0
    ([0.0, 0.0], None),                 # nothing moved: no bound
])
def test_round_bound_is_a_multiple_of_the_lower_median(norms: list[float],
                                                       expected: float | None) -> None:
    assert round_bound(norms, 3.0) == expected


def test_clip_scales_the_outlier_to_the_bound_and_keeps_direction() -> None:
    # Prepare: honest norms 1 and 2, an attacker at -20 (norm 20); bound = 3 x 2 = 6
    updates = [upd("a", 1.0), upd("b", 0.0, 2.0), upd("x", -20.0)]
    # Execute
    out = bound_updates(updates, REF, "clip", 3.0)
    # Assert
    assert [u.client_id for u in out.updates] == ["a", "b", "x"]
    assert out.bound == pytest.approx(0.6)  # per example: 3 x (2 / 10)
    assert out.clipped == {"x": pytest.approx(0.3)}
    np.testing.assert_allclose(out.updates[2].state["w"], [3.0 - 6.0, 4.0], rtol=1e-6)
    assert out.updates[2].state["n"] == 9 and out.updates[2].state["w"].dtype == np.float32
    assert out.updates[0] is updates[0]  # within the bound: untouched


def test_reject_drops_the_outlier_with_a_reason() -> None:
    out = bound_updates([upd("a", 1.0), upd("b", 2.0), upd("x", 9.0)], REF, "reject", 3.0)
    assert [u.client_id for u in out.updates] == ["a", "b"]
    assert "x its 10 examples (6)" in out.rejected["x"]


def test_the_bound_scales_with_each_clients_examples() -> None:
    # Prepare: per-example norms 0.1, 0.1, 0.1 and 1.0; lower median 0.1 -> 0.3 per example
    updates = [upd("small", 1.0, examples=10), upd("big", 50.0, examples=500),
               upd("mid", 0.0, 10.0, examples=100), upd("x", 10.0, examples=10)]
    # Execute
    out = bound_updates(updates, REF, "reject", 3.0)
    # Assert: the big honest client (norm 50, 500 examples) stays; the attacker (norm 10 with
    # 10 examples, bound 3) goes
    assert [u.client_id for u in out.updates] == ["small", "big", "mid"]
    assert list(out.rejected) == ["x"]


def test_none_keeps_everything() -> None:
    updates = [upd("a", 1.0), upd("x", 1e6)]
    assert bound_updates(updates, REF, "none", 3.0).updates == updates


@pytest.mark.parametrize(("mode", "multiple", "message"), [
    ("median", 3.0, "update-bound='median'"), ("clip", 1.0, "update-bound-multiple=1.0")])
def test_bad_settings_are_refused(mode: str, multiple: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bound_updates([], REF, mode, multiple)


def test_a_clipped_update_forgets_the_norm_its_reply_check_measured() -> None:
    # Prepare: the attacker's norm 20 as the reply check measured it, the others unmeasured
    updates = [upd("a", 1.0), upd("b", 0.0, 2.0),
               dataclasses.replace(upd("x", -20.0), norm=20.0)]
    # Execute: the bound reads the kept norm (20 > 6) and clips
    out = bound_updates(updates, REF, "clip", 3.0)
    # Assert: the clipped state's norm is 6 now, so the stale 20 is not carried on
    assert out.clipped == {"x": pytest.approx(6.0 / 20.0)}
    assert [u.norm for u in out.updates] == [None, None, None]
    assert update_norm(out.updates[2].state, REF) == pytest.approx(6.0, rel=1e-6)
