"""Shared glue of the peer defences (FLTrust, FoolsGold): FedAvg with update-space weights.

Both peers see a round's accepted updates as flat vectors ``d_i = W_i - W`` (floating arrays
only) and produce a new global ``W + delta`` together with one weight per client.
:class:`UpdateWeighted` is the thin Flower part: it keeps the global model sent in
``configure_train``, validates replies one by one as FedOwen does
(:func:`fedowen_strategy.replies.parse_replies`: a malformed reply rejects only itself),
orders updates by client id and calls the subclass's :meth:`UpdateWeighted.combine`. What
it decided lands in ``round_record`` (per-client ``weights``, ``returned``, ``rejected`` and
the peer's own fields), which the ServerApp's recorder merges into ``rounds.jsonl``.

The defences are not a peer's business: the ServerApp wraps a peer, as any Flower strategy, in
:class:`~fedowen_strategy.defences.defended.Defended`, whose settle steps read the weights the
peer applied from ``round_record["weights"]`` (the statistics rule combines the clients'
normalisation statistics at the peer's weights). Unwrapped, a peer averages the statistics by
its weights (the buffer rule of :mod:`fedowen_strategy.updates`).
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from numpy.typing import NDArray

from fedowen_strategy.nodes import client_order
from fedowen_strategy.replies import parse_replies, record_to_state, state_to_record
from fedowen_strategy.updates import (
    State,
    apply_delta,
    average_buffers,
    flat_deltas,
    update_keys,
)

log = logging.getLogger(__name__)


class UpdateWeighted(FedAvg):
    """FedAvg whose aggregation is ``W + combine(updates)``; subclasses override
    :meth:`combine` only. ``round_record`` holds the last round's decisions."""

    name = "update-weighted"

    def __init__(self, **fedavg: Any) -> None:
        super().__init__(**fedavg)
        self._global: ArrayRecord | None = None
        self.round_record: dict[str, Any] = {}

    @abstractmethod
    def combine(self, server_round: int, reference: State, client_ids: list[str],
                deltas: NDArray[np.floating], keys: list[str]
                ) -> tuple[NDArray[np.floating] | None, NDArray[np.float64], dict[str, Any]]:
        """(aggregate delta or None to keep the global model, per-client weights, extra
        record fields) for one round's flat updates ``deltas`` (one row per client)."""

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._global = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate the replies, combine the accepted updates, record the weights."""
        if self._global is None:
            raise RuntimeError("aggregate_train called before configure_train")
        started = time.perf_counter()
        reference = record_to_state(self._global)
        parsed = parse_replies(list(replies), reference, arrays_key=self.arrayrecord_key,
                               weight_key=self.weighted_by_key)
        parsed.updates.sort(key=lambda upd: client_order(upd.client_id))
        ids = [u.client_id for u in parsed.updates]
        self.round_record = {"returned": ids, "rejected": parsed.rejected}
        if not parsed.updates:
            log.warning("round %d: no usable update; global model kept", server_round)
            self.round_record["kept_global"] = "no usable update"
            return None, MetricRecord({"num-returned": 0})
        keys = update_keys(reference)
        deltas = flat_deltas([u.state for u in parsed.updates], reference, keys)
        delta, weights, extra = self.combine(server_round, reference, ids, deltas, keys)
        if delta is not None and not np.isfinite(delta).all():
            delta, extra = None, {**extra, "kept_global": "the aggregate is not finite"}
        self.round_record.update(extra, weights=dict(zip(ids, weights.tolist(), strict=True)),
                                 aggregation_seconds=time.perf_counter() - started)
        metrics = MetricRecord({"num-returned": len(ids),
                                **{f"weight/{c}": float(w) for c, w in zip(ids, weights,
                                                                          strict=True)}})
        if delta is None:
            log.warning("round %d: %s: %s; global model kept", server_round, self.name,
                        extra.get("kept_global", "no aggregate"))
            return None, metrics
        log.info("aggregate_train: round %d, %s weights %s", server_round, self.name,
                 ", ".join(f"{c}={w:.3f}" for c, w in zip(ids, weights, strict=True)))
        # statistics and counters: the buffer rule (fedowen_strategy.updates), peer's weights;
        # the statistics rule is a settle step of the defences around the peer (Defended)
        buffers = average_buffers([u.state for u in parsed.updates], weights, reference)
        return state_to_record(apply_delta(reference, delta, keys,
                                           others={**reference, **buffers})), metrics
