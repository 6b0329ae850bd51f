"""The bound in force (fedowen_strategy.defences.guards.bound_in_force) is what the guards
let through."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.guards import bound_in_force, cap_reference, guard_round
from fedowen_strategy.replies import parse_replies, state_to_record
from fedowen_strategy.updates import update_norm

GLOBAL = {"w": np.array([3.0, 4.0, 0.0], np.float64), "n": np.array([2], np.int64)}  # norm 5
#: Nine honest updates of norms 0.1, ..., 0.9 (10 examples each) along w's first axis
HONEST = [np.array([0.1 * (i + 1), 0.0, 0.0]) for i in range(9)]
OFF: dict[str, Any] = {"max_norm_ratio": 0.0, "update_bound": "none", "norm_cap": "none"}
SERVER_NORM = 0.4


def _reply(delta: np.ndarray, cid: str) -> Message:
    request = Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=1)
    return Message(RecordDict({
        "arrays": state_to_record({"w": GLOBAL["w"] + delta, "n": GLOBAL["n"]}),
        "metrics": MetricRecord({"num-examples": 10}),
        "client": ConfigRecord({"client-id": cid})}), reply_to=request)


def _passes_unchanged(probe_norm: float, guards: Guards, norm_cap: str) -> bool:
    """Whether a probe update of that norm (10 examples, along w's last axis) comes through
    the reply check and the round's guards untouched, beside the nine honest updates."""
    replies = [_reply(d, str(i)) for i, d in enumerate(HONEST)]
    replies.append(_reply(np.array([0.0, 0.0, probe_norm]), "probe"))
    parsed = parse_replies(replies, GLOBAL, max_norm_ratio=guards.max_norm_ratio)
    if "probe" in parsed.rejected:
        return False
    out = guard_round(parsed.updates, GLOBAL, guards, norm_cap=norm_cap, value_players=False,
                      server_update=lambda: {"w": GLOBAL["w"] + [SERVER_NORM, 0.0, 0.0],
                                             "n": GLOBAL["n"]})
    return ("probe" not in out.rejected and "probe" not in out.clipped
            and "probe" not in out.record.get("capped", {}))


@pytest.mark.parametrize(("settings", "norm_cap", "expected"), [
    ({**OFF, "max_norm_ratio": 0.2}, "none", 1.0),               # 0.2 x ||global|| = 5
    ({**OFF, "update_bound": "clip"}, "none", 1.5),              # 3 x 0.05 per example x 10
    ({**OFF, "update_bound": "reject"}, "none", 1.5),
    ({**OFF, "norm_cap_multiple": 1.5}, "median", 0.75),         # 1.5 x the median 0.5
    ({**OFF}, "server", 2 * SERVER_NORM),                        # 2 x the server step's norm
    ({"max_norm_ratio": 0.3, "update_bound": "clip", "norm_cap_multiple": 3.5}, "median", 1.5),
])
def test_the_bound_in_force_is_where_the_guards_start_to_act(
        settings: dict[str, Any], norm_cap: str, expected: float) -> None:
    # Prepare: the round's norms as the guards will see them (the probe above the median, so
    # its own size does not move it)
    guards = Guards(**settings)
    norms = [float(np.linalg.norm(d)) for d in HONEST] + [10.0]
    # Execute
    bound = bound_in_force(guards, norm_cap, norms=norms, examples=[10] * 10, own_examples=10,
                           global_norm=update_norm(GLOBAL, {"w": np.zeros(3)}),
                           server_norm=SERVER_NORM if norm_cap == "server" else None)
    # Assert: computed by hand, and the guards let a probe just under it through untouched
    # and act on one just over it
    assert bound == pytest.approx(expected)
    assert bound is not None
    assert _passes_unchanged(0.999 * bound, guards, norm_cap)
    assert not _passes_unchanged(1.001 * bound, guards, norm_cap)


def test_no_bound_when_no_guard_is_on() -> None:
    assert bound_in_force(Guards(**OFF), "none", norms=[1.0], examples=[10], own_examples=10,
                          global_norm=5.0) is None
    # a zero global model has no norm to compare with: max-norm-ratio skips it, as the reply
    # check does
    assert bound_in_force(Guards(**{**OFF, "max_norm_ratio": 10.0}), "none", norms=[1.0],
                          examples=[10], own_examples=10, global_norm=0.0) is None


def test_the_caps_reference_is_the_server_step_or_the_median_it_is_given() -> None:
    norms = [0.0, 3.0, 1.0, 2.0]
    assert cap_reference("none", norms, 9.0) is None
    assert cap_reference("median", norms, 9.0) == 2.0    # the lower median of 1, 2, 3
    assert cap_reference("server", norms, 9.0) == 9.0
    assert cap_reference("server", norms, None) == 2.0   # no step taken: the median
    assert cap_reference("median", norms, median=max) == 3.0
