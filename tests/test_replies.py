"""Per-reply validation: each malformed reply is dropped with its reason, the rest kept."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict

from fedowen_strategy import replies
from fedowen_strategy.replies import parse_replies, state_to_record

REF = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}


def reply(state: dict[str, np.ndarray] | None, num_examples: Any = 10, cid: str = "a",
          node: int = 1) -> Message:
    request = Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=node)
    content = RecordDict({"metrics": MetricRecord({"num-examples": num_examples}),
                          "client": ConfigRecord({"client-id": cid})})
    if state is not None:
        content["arrays"] = state_to_record(state)
    return Message(content, reply_to=request)


def good(scale: float = 1.01) -> dict[str, np.ndarray]:
    return {"w": REF["w"] * scale, "b": REF["b"] + 0.01}


@pytest.mark.parametrize(("state", "num_examples", "reason"), [
    ({"w": np.full((2, 3), np.nan, np.float32), "b": REF["b"]}, 10, "NaN or Inf"),
    ({"w": np.full((2, 3), np.inf, np.float32), "b": REF["b"]}, 10, "NaN or Inf"),
    ({"w": np.ones((3, 2), np.float32), "b": REF["b"]}, 10, "expected float32[2, 3]"),
    ({"w": np.ones((2, 3), np.float64), "b": REF["b"]}, 10, "expected float32[2, 3]"),
    ({"w": REF["w"]}, 10, "missing ['b']"),
    (None, 10, "no ArrayRecord"),
    (good(), 0, "num-examples=0 must be a positive integer"),
    (good(), -3, "num-examples=-3"),
    (good(), 0.5, "num-examples=0.5 must be a positive integer"),
    (good(), 12.5, "num-examples=12.5"),
    (good(), float("nan"), "num-examples=nan"),
    (good(), float("inf"), "num-examples=inf"),
    (good(), 2.0**60, "must be a positive integer"),
    (good(), [10, 10], "num-examples=[10, 10]"),
    ({"w": REF["w"] * 1000, "b": REF["b"]}, 10, "exceeds 10.0 x the global model's norm"),
])
def test_each_malformed_reply_is_rejected_with_its_reason(
        state: dict[str, np.ndarray] | None, num_examples: Any, reason: str) -> None:
    # Prepare: one bad reply among two good ones
    replies = [reply(good(), cid="ok1"), reply(state, num_examples, cid="bad"),
               reply(good(1.02), cid="ok2")]
    # Execute
    parsed = parse_replies(replies, REF, max_norm_ratio=10.0)
    # Assert
    assert [u.client_id for u in parsed.updates] == ["ok1", "ok2"]
    assert list(parsed.rejected) == ["bad"] and reason in parsed.rejected["bad"]


def test_integral_float_count_is_accepted_as_int() -> None:
    parsed = parse_replies([reply(good(), num_examples=12.0)], REF)
    assert parsed.updates[0].num_examples == 12 and isinstance(parsed.updates[0].num_examples,
                                                               int)


def test_undecodable_arrays_reject_only_that_reply() -> None:
    # Prepare: an Array whose bytes do not match its declared shape
    from flwr.app import Array, ArrayRecord

    bad = reply(good(), cid="bad")
    bad.content["arrays"] = ArrayRecord(array_dict={
        "w": Array(dtype="float32", shape=(2, 3), stype="numpy.ndarray", data=b"\x00" * 5),
        "b": Array(REF["b"])})
    # Execute
    parsed = parse_replies([bad, reply(good(), cid="ok")], REF)
    # Assert
    assert [u.client_id for u in parsed.updates] == ["ok"]
    assert parsed.rejected["bad"].startswith("malformed reply")


def test_error_replies_count_as_failures() -> None:
    request = Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=7)
    failed = Message(Error(code=3, reason="out of memory"), reply_to=request)
    parsed = parse_replies([failed, reply(good())], REF)
    assert parsed.failed == {"node:7": "error 3: out of memory"}
    assert len(parsed.updates) == 1
    # a node the strategy knows is counted under its client id, not as node:7 besides it
    parsed = parse_replies([failed, reply(good())], REF, known={7: "c7"})
    assert parsed.failed == {"c7": "error 3: out of memory"}


def test_second_reply_of_a_client_is_rejected() -> None:
    parsed = parse_replies([reply(good(), cid="a"), reply(good(1.02), cid="a", node=2)], REF)
    assert len(parsed.updates) == 1 and "second reply" in parsed.rejected["a"]


def test_norm_check_off_by_zero() -> None:
    huge = {"w": REF["w"] * 1000, "b": REF["b"]}
    assert len(parse_replies([reply(huge)], REF, max_norm_ratio=0.0).updates) == 1


def test_short_labels_shorten_only_unnamed_nodes() -> None:
    from fedowen_strategy.replies import short_label

    assert short_label("node:12130585911003349460") == "node:..349460"
    assert short_label("site-a") == "site-a" and short_label("17") == "17"
    assert short_label("node:42") == "node:42"


def test_the_check_keeps_each_updates_norm_for_the_guards() -> None:
    # Prepare: w moves by 1 on each of its 6 entries, b by 0 (norm sqrt(6)); and a reply
    # checked with max-norm-ratio off
    moved = {"w": REF["w"] + 1.0, "b": REF["b"]}
    # Execute
    measured = parse_replies([reply(moved)], REF, max_norm_ratio=10.0).updates[0]
    unmeasured = parse_replies([reply(moved)], REF, max_norm_ratio=0.0).updates[0]
    # Assert: the norm the check measured rides along; none where nothing measured it
    assert measured.norm == pytest.approx(np.sqrt(6.0), rel=1e-7)
    assert unmeasured.norm is None


def test_a_ray_wrapped_clientapp_error_is_recorded_as_its_own_message() -> None:
    # Prepare: Ray's text of one exception on two actors (pids, ids, addresses differ)
    def ray_text(pid: int, actor: str) -> str:
        return ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::"
                f"ClientAppActor.run()\x1b[39m (pid={pid}, ip=192.0.2.2, actor_id={actor}, "
                "repr=<ClientAppActor object at 0x7fb0bf3c8c90>)\n  File \"app.py\", line 1\n"
                "flwr.clientapp.client_app.ClientAppException: \nException ClientAppException "
                "occurred. Message: too few samples: lower min_size'>")

    # Execute
    reasons = {replies.failure_reason(2, ray_text(p, a)) for p, a in ((1, "ab"), (2, "cd"))}
    # Assert: one reason, the ClientApp's; other reasons keep their text
    assert reasons == {"error 2: ClientApp raised: too few samples: lower min_size"}
    assert replies.failure_reason(3, "out of memory") == "error 3: out of memory"
    assert replies.failure_reason(0, None) == "error 0: "

