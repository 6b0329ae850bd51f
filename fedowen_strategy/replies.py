"""Turn training replies into validated client updates, one reply at a time.

Flower's own ``validate_message_reply_consistency`` rejects the *whole round* when one reply
is inconsistent. Here each reply is checked on its own against the global model it started
from; a bad reply is dropped with one log line naming the client and the reason, and the
round goes on with the rest.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict
from numpy.typing import NDArray

from fedowen_strategy.updates import model_norm, update_norm

# the message protocol the ClientApp shares (the library's one import from the task module)
from fedowen_task.protocol import (
    CLIENT_ID_FIELD,
    CLIENT_RECORD_KEY,
    NUM_EXAMPLES_FIELD,
    RAY_NODE_FIELD,
)

log = logging.getLogger(__name__)

#: Largest ``num-examples`` a reply may claim (exact in float64, no overflow in weights).
MAX_EXAMPLES = 2**53


@dataclass(frozen=True)
class ClientUpdate:
    """One accepted training reply. ``norm``: its update's
    :func:`~fedowen_strategy.updates.update_norm` to the global model it was parsed against,
    where the reply check measured it (``max-norm-ratio`` on), so the guards do not measure it
    again; None when not measured, and reset by a guard that changes the update."""

    node_id: int
    client_id: str
    state: dict[str, NDArray]
    num_examples: int
    train_loss: float
    norm: float | None = None


@dataclass
class ParsedReplies:
    """Accepted updates plus what was dropped and why (client or node id -> reason), and the
    factor each clipped update was scaled by (set by :mod:`fedowen_strategy.defences.bounds`)."""

    updates: list[ClientUpdate] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    clipped: dict[str, float] = field(default_factory=dict)


def record_to_state(record: ArrayRecord) -> dict[str, NDArray]:
    """Flower ``ArrayRecord`` -> ordered ``{name: ndarray}``."""
    return {key: array.numpy() for key, array in record.items()}


def state_to_record(state: Mapping[str, NDArray]) -> ArrayRecord:
    """Ordered ``{name: ndarray}`` -> Flower ``ArrayRecord`` (keys, order, shapes and dtypes
    kept: a 0-d array such as BatchNorm's ``num_batches_tracked`` stays 0-d, where
    ``numpy.ascontiguousarray`` would make it ``[1]`` and every later reply mismatch it)."""
    from flwr.app import Array

    return ArrayRecord(array_dict={k: Array(np.asarray(v, order="C")) for k, v in state.items()})


def short_label(client_id: str, digits: int = 6) -> str:
    """How a client is shown in logs and plots: its client id, or for a node that named
    itself nowhere ``node:<id>`` shortened to its last ``digits`` digits (node ids are random
    64-bit integers); the records keep the full id."""
    if client_id.startswith("node:") and len(client_id) > 5 + digits:
        return f"node:..{client_id[-digits:]}"
    return client_id


def client_id_of(msg: Message, known: Mapping[int, str] | None = None) -> str:
    """The stable id a reply names itself with, else the id ``known`` binds its node to (an
    error reply names nobody), else ``node:<node_id>``."""
    content = msg.content if msg.has_content() else None
    if content is not None and CLIENT_RECORD_KEY in content.config_records:
        value = content.config_records[CLIENT_RECORD_KEY].get(CLIENT_ID_FIELD)
        if isinstance(value, str | int) and str(value):
            return str(value)
    node = msg.metadata.src_node_id
    return (known or {}).get(node, f"node:{node}")


def ray_nodes(replies: Iterable[Message]) -> dict[str, list[str]]:
    """Ray node id -> ids of the clients whose reply says they ran there; empty when no
    reply names a node (the inline backend, a deployment). Where a cluster ran each client."""
    nodes: dict[str, list[str]] = {}
    for msg in replies:
        if msg.has_error() or CLIENT_RECORD_KEY not in msg.content.config_records:
            continue
        node = msg.content.config_records[CLIENT_RECORD_KEY].get(RAY_NODE_FIELD)
        if isinstance(node, str) and node:
            nodes.setdefault(node, []).append(client_id_of(msg))
    return {node: sorted(ids) for node, ids in sorted(nodes.items())}


def norm_ratio_limit(max_norm_ratio: float, global_norm: float) -> float | None:
    """The largest update norm ``max-norm-ratio`` lets through: that multiple of the global
    model's norm; None when the check is off (0) or the global model has no norm to compare
    with (e.g. initialised to zeros)."""
    if not max_norm_ratio > 0 or not global_norm > 0:
        return None
    return max_norm_ratio * global_norm


def _check_state(state: Mapping[str, NDArray], reference: Mapping[str, NDArray],
                 max_norm_ratio: float, global_norm: float | None = None) -> str | None:
    """Reason the state is unusable, or None when it matches ``reference`` (whose
    :func:`~fedowen_strategy.updates.model_norm` is ``global_norm``, computed unless given)."""
    checked = _measure(state, reference, max_norm_ratio, global_norm)
    return checked if isinstance(checked, str) else None


def _measure(state: Mapping[str, NDArray], reference: Mapping[str, NDArray],
             max_norm_ratio: float, global_norm: float | None) -> str | float | None:
    """:func:`_check_state`'s reason, else the update's norm where ``max_norm_ratio`` measured
    it (None when the check is off)."""
    if list(state) != list(reference):
        missing = sorted(set(reference) - set(state))
        extra = sorted(set(state) - set(reference))
        return f"array keys differ from the global model (missing {missing}, extra {extra})"
    for key, ref in reference.items():
        arr = state[key]
        if arr.shape != ref.shape or arr.dtype != ref.dtype:
            return (f"array {key!r} is {arr.dtype}{list(arr.shape)}, "
                    f"expected {ref.dtype}{list(ref.shape)}")
        if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
            return f"array {key!r} holds NaN or Inf"
        if key.endswith("running_var") and np.any(arr < 0):
            return (f"array {key!r} holds a negative variance ({float(arr.min()):.3g}): a "
                    "normalisation layer's running variance is never below 0")
    if global_norm is None:
        global_norm = model_norm(reference) if max_norm_ratio > 0 else 0.0
    limit = norm_ratio_limit(max_norm_ratio, global_norm)
    if limit is None:
        return None
    norm = update_norm(state, reference)  # the norm of the update, not of the statistics
    if norm > limit:
        return (f"update norm {norm:.3g} exceeds {max_norm_ratio} x the global "
                f"model's norm {global_norm:.3g}")
    return norm


def _parse_one(msg: Message, reference: Mapping[str, NDArray], arrays_key: str,
               weight_key: str, max_norm_ratio: float, global_norm: float) -> ClientUpdate | str:
    content = msg.content
    if arrays_key not in content.array_records:
        return f"reply has no ArrayRecord {arrays_key!r} (has {list(content.array_records)})"
    metrics = next(iter(content.metric_records.values()), None)
    if metrics is None or weight_key not in metrics:
        return f"reply has no {weight_key!r} metric"
    num_examples = _count(metrics[weight_key])
    if num_examples is None:
        return (f"{weight_key}={metrics[weight_key]!r} must be a positive integer "
                f"(at most {MAX_EXAMPLES})")
    state = record_to_state(content.array_records[arrays_key])
    measured = _measure(state, reference, max_norm_ratio, global_norm)
    if isinstance(measured, str):
        return measured
    loss = metrics.get("train-loss", float("nan"))
    if isinstance(loss, list):
        return f"train-loss={loss!r} must be a number"
    return ClientUpdate(
        node_id=msg.metadata.src_node_id,
        client_id=client_id_of(msg),
        state=state,
        num_examples=num_examples,
        train_loss=float(loss) if np.isfinite(loss) else float("nan"),
        norm=measured,
    )


def _count(value: object) -> int | None:
    """``value`` as a positive integer count, or None: 12 and 12.0 pass; 0.5, 0, -3, NaN,
    lists, booleans and counts above :data:`MAX_EXAMPLES` do not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (np.isfinite(value) and value.is_integer()):
        return None
    count = int(value)
    return count if 0 < count <= MAX_EXAMPLES else None


#: Terminal colours in an error's text (Ray colours its actor's name).
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
#: Where Ray's wrapper of a ClientApp's exception (its traceback, the actor's pid, address and
#: id, which differ by node) gives way to the ClientApp's own message.
_RAY_MESSAGE = "ClientAppException occurred. Message: "


def failure_reason(code: int, reason: str | None) -> str:
    """A failed reply's reason as the round record keeps it: ``error <code>: <text>``. For an
    exception a ClientApp raised under Ray, the text is its own message (Ray's traceback is in
    the log already), so every node that failed alike gives one reason."""
    text = _COLOURS.sub("", reason or "")
    if _RAY_MESSAGE in text:
        text = "ClientApp raised: " + text.rsplit(_RAY_MESSAGE, 1)[1].removesuffix("'>").strip()
    return f"error {code}: {text}"


def parse_replies(
    replies: Iterable[Message],
    reference: Mapping[str, NDArray],
    *,
    arrays_key: str = "arrays",
    weight_key: str = NUM_EXAMPLES_FIELD,
    max_norm_ratio: float = 0.0,
    known: Mapping[int, str] | None = None,
) -> ParsedReplies:
    """Validate every reply against the global ``reference`` state.

    No single reply can raise here: whatever is wrong with it (a missing record, a
    non-integral or absurd ``num-examples``, undecodable arrays) rejects that reply only.

    ``max_norm_ratio`` > 0 also rejects updates whose distance to the global model exceeds
    that multiple of the global model's norm (an "absurd norm"); 0 disables the check, and a
    global model of norm 0 (nothing to compare with) skips it.

    ``known`` (node id -> client id, the strategy's identity book) names the node of an error
    reply, which carries no client id of its own: a client that failed is then counted under
    the id it was selected by, not a second time as ``node:<id>``.
    """
    out = ParsedReplies()
    seen: set[str] = set()
    global_norm = model_norm(reference) if max_norm_ratio > 0 else 0.0  # once, not per reply
    for msg in replies:
        who = client_id_of(msg, known)
        if msg.has_error():
            out.failed[who] = failure_reason(msg.error.code, msg.error.reason)
            log.warning("client %s failed this round: %s", who, out.failed[who])
            continue
        try:
            result = _parse_one(msg, reference, arrays_key, weight_key, max_norm_ratio,
                                global_norm)
        except Exception as err:  # a malformed record (bad bytes, odd types) drops this reply
            result = f"malformed reply ({type(err).__name__}: {err})"
        if isinstance(result, str):
            out.rejected[who] = result
            log.warning("rejected the update of client %s: %s", who, result)
        elif result.client_id in seen:
            out.rejected[who] = "a second reply from the same client in one round"
            log.warning("rejected the update of client %s: %s", who, out.rejected[who])
        else:
            seen.add(result.client_id)
            out.updates.append(result)
    return out


def contents_of(replies: Iterable[Message], nodes: Sequence[int]) -> list[RecordDict | None]:
    """Each of ``nodes``' reply content, in their order: ``None`` for a node that failed or
    did not answer (a selector's query to clients)."""
    by_node = {msg.metadata.src_node_id: msg.content for msg in replies if not msg.has_error()}
    return [by_node.get(node) for node in nodes]
