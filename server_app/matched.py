"""Flower's strategies aggregate only replies whose model matches the global model's.

Flower's FedAvg checks that the replies agree with each other (the same array names, else
``InconsistentMessageReplies`` ends the run with Flower's message), not with the model it
sent: replies that all come from another model (another ``model``, another number of classes)
are averaged into a model of the wrong shape, and the ServerApp's evaluation then fails to
load it with torch's "size mismatch"; a mix of shapes fails inside numpy's broadcasting.
:class:`Matched` rejects each reply whose array names or shapes differ from the model sent,
in FedOwen's words (:func:`fedowen_strategy.replies.parse_replies`), before the strategy
aggregates, and puts it in the round's ``rejected``: the stall rule (:mod:`server_app.stall`)
then holds for Flower's strategies and the peers as it does for FedOwen. Dtypes are not
compared: Flower's average turns integer buffers into floats and the clients send integers
back, which Flower's strategies have always accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedowen_strategy.replies import client_id_of

log = logging.getLogger(__name__)


def mismatch(arrays: ArrayRecord, reference: ArrayRecord) -> str | None:
    """Why ``arrays`` cannot be averaged into ``reference``'s model (array names or shapes
    differ), or None."""
    if set(arrays) != set(reference):
        missing = sorted(set(reference) - set(arrays))
        extra = sorted(set(arrays) - set(reference))
        return f"array keys differ from the global model (missing {missing}, extra {extra})"
    for key, ref in reference.items():
        arr = arrays[key]
        if list(arr.shape) != list(ref.shape):
            return (f"array {key!r} is {arr.dtype}{list(arr.shape)}, "
                    f"expected {ref.dtype}{list(ref.shape)}")
    return None


def reply_mismatch(reply: Message, reference: ArrayRecord, key: str) -> str | None:
    """:func:`mismatch` of a reply's ArrayRecord ``key``; a reply without one is left to the
    strategy's own checks."""
    records = reply.content.array_records
    return mismatch(records[key], reference) if key in records else None


class Matched(Strategy):
    """Mixin before a Flower strategy (after :class:`server_app.strategies.Recorded`): keeps
    the model sent in ``configure_train`` and drops the replies that do not match it; what it
    decided lands in ``round_record`` (``returned``, ``rejected``), which ``Recorded`` merges
    into the round's record (a peer's own ``round_record`` is kept, the rejections added)."""

    arrayrecord_key: str
    round_record: dict[str, Any]
    _sent: ArrayRecord | None = None

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._sent = arrays
        return super().configure_train(  # type: ignore[safe-super]
            server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        kept, rejected = [], {}
        for reply in replies:
            reason = None if reply.has_error() or self._sent is None else reply_mismatch(
                reply, self._sent, self.arrayrecord_key)
            if reason is None:
                kept.append(reply)
            else:
                rejected[client_id_of(reply)] = reason
                log.warning("rejected the update of client %s: %s", client_id_of(reply),
                            reason)
        self.round_record = {}  # a peer sets its own in the call below
        result = super().aggregate_train(server_round, kept)  # type: ignore[safe-super]
        own = self.round_record
        own.setdefault("returned", [client_id_of(r) for r in kept if not r.has_error()])
        own["rejected"] = {**rejected, **own.get("rejected", {})}
        return result
