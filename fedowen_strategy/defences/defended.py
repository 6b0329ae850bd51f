"""A defence list around any Flower strategy: :class:`Defended`, the shape of Flower's own DP
wrappers (``DifferentialPrivacyServerSideFixedClipping``: clip the replies, let the wrapped
strategy aggregate them, add noise to what it returns).

Each round :class:`Defended` first runs the list's dispatch steps over the model the wrapped
strategy is to send (BackdoorIndicator plants its task there; without such a step the model
passes as it came), then its refuse steps over the reply messages, decodes the
rest (:class:`~fedowen_strategy.replies.ClientUpdate`, against the model it sent), runs the
screen steps, writes back into its reply each update a step changed (as Flower's wrapper does)
and drops the replies a step rejected; the wrapped strategy aggregates what is left, and the
settle steps rewrite its aggregate, with the weights the strategy says it applied (a peer's
``round_record["weights"]``) or else the replies' ``weighted_by_key`` counts (FedAvg's). What
the steps did lands in :attr:`Defended.round_record` (``rejected``, ``clipped`` and the steps'
own fields, beside the wrapped strategy's), which the ServerApp merges into ``rounds.jsonl``.

A reply that carries an error or no ``arrays`` record passes to the wrapped strategy as it came
(its own checks answer it), as does every reply a step leaves unchanged: under a list whose
steps are all off the wrapped strategy sees the very messages it would have seen unwrapped.
A strategy that values players is FedOwen, which runs the list itself: here ``norm-cap =
auto`` resolves to ``none`` (as for FedOwen's FedAvg baselines; ``median`` or ``server`` cap as
they say) and the value cap and near-parallel links do not act (copies are recorded, not
merged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from numpy.typing import NDArray

from fedowen_strategy.defences.base import (
    Dispatching,
    Gate,
    Guard,
    GuardedRound,
    RoundView,
    Settling,
    dispatch_model,
    refuse_replies,
    screen_round,
    settle_round,
)
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.identity import Roster
from fedowen_strategy.defences.table import build
from fedowen_strategy.replies import ClientUpdate, client_id_of, record_to_state, state_to_record

log = logging.getLogger(__name__)
#: ``(global_state, round) -> state``: one server training step (``update-filter =
#: server-direction``).
ServerStep = Callable[[Mapping[str, NDArray], int], Mapping[str, NDArray]]


class Defended(Strategy):
    """``strategy`` with the defence list ``defences`` around it.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        Any strategy (Flower's FedAvg, Krum, ...; a peer).
    defences : str or sequence of str or Guard
        The list, in order (:func:`fedowen_strategy.defences.table.build`): ``auto`` is
        :data:`~fedowen_strategy.defences.table.FLOWER_DEFENCES`, what the ServerApp applied
        around Flower's strategies before the list.
    guards : Guards, optional
        The steps' settings (the app's defaults).
    seed : int
        Seeds the settle steps' generator (``aggregate-noise``).
    server_step : callable, optional
        ``(global_state, round) -> state``, for ``update-filter = server-direction``.
    """

    def __init__(self, strategy: Strategy, defences: str | Sequence[str | Guard] = "auto",
                 guards: Guards | None = None, *, seed: int = 0,
                 server_step: ServerStep | None = None) -> None:
        super().__init__()
        self.strategy = strategy
        self.guards = guards or Guards()
        self.defences = build(defences, fedowen=False)
        self.rng = np.random.default_rng(np.random.SeedSequence(seed))
        self.roster = Roster()  # the identity step's book: node id -> the client id it named
        self.defended_step = server_step
        self.norm_cap = "none" if self.guards.norm_cap == "auto" else self.guards.norm_cap
        steps = {d.name for d in self.defences}
        if server_step is None and (
                (self.norm_cap == "server" and "norm-cap" in steps)
                or (self.guards.update_filter == "server-direction" and "update-filter" in steps)):
            raise ValueError(f"norm_cap={self.norm_cap!r}, update_filter="
                             f"{self.guards.update_filter!r} needs server_step (one server "
                             "training step on the evaluation set); or use norm_cap='median' "
                             "and another filter")
        self.round_record: dict[str, Any] = {}
        self._sent: ArrayRecord | None = None
        self._connected: tuple[int, ...] = ()

    @property
    def arrayrecord_key(self) -> str:
        """The wrapped strategy's ``arrayrecord_key`` (``arrays`` when it has none)."""
        return str(getattr(self.strategy, "arrayrecord_key", "arrays"))

    @property
    def weighted_by_key(self) -> str:
        """The wrapped strategy's ``weighted_by_key`` (``num-examples`` when it has none)."""
        return str(getattr(self.strategy, "weighted_by_key", "num-examples"))

    def summary(self) -> None:
        log.info("\t├──> Defences, in order: %s",
                 "; ".join(d.summary(self.guards) for d in self.defences) or "none")
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The list's dispatch steps rewrite the model (none: ``arrays`` as it came); the
        wrapped strategy sends that one, and the round's updates are read against it."""
        arrays = dispatch_model(self.defences, arrays, Dispatching(server_round, self.guards))
        self._sent = arrays
        self._connected = tuple(grid.get_node_ids())
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Refuse, screen, let the wrapped strategy aggregate, settle."""
        if self._sent is None:
            raise RuntimeError("aggregate_train called before configure_train")
        kept, refused = refuse_replies(self.defences, list(replies),
                                       Gate(self.roster, self._connected))
        reference = record_to_state(self._sent)
        step = self.defended_step
        view = RoundView(reference, self.guards, self.norm_cap, False, server_round,
                         None if step is None else lambda: step(reference, server_round))
        decoded = self._decode(kept)
        screened = screen_round(self.defences, [u for u, _ in decoded.values()], view)
        passed = self._passed(kept, decoded, screened)
        result = self.strategy.aggregate_train(server_round, passed)
        own = dict(getattr(self.strategy, "round_record", None) or {})
        self.round_record = {**own, **screened.record,
                             "rejected": {**refused, **screened.rejected,
                                          **own.get("rejected", {})}}
        if screened.clipped:
            self.round_record["clipped"] = screened.clipped
        if result[0] is None:
            return result
        states, ids, weights = self._combined(passed, screened, decoded, own)
        if not ids or not weights.sum() > 0:
            return result
        state, fields = settle_round(self.defences, record_to_state(result[0]),
                                     Settling(view, states, ids, weights, self.rng,
                                              screened.record))
        self.round_record.update(fields)
        return state_to_record(state), result[1]

    def _decode(self, replies: list[Message]) -> dict[int, tuple[ClientUpdate, float]]:
        """Node id -> (its update, its ``weighted_by_key`` count; 0 without one), for each
        reply without an error that carries the arrays record."""
        out: dict[int, tuple[ClientUpdate, float]] = {}
        for msg in replies:
            if msg.has_error() or self.arrayrecord_key not in msg.content.array_records:
                continue
            weight = _weight(msg, self.weighted_by_key)
            node = msg.metadata.src_node_id
            out[node] = (ClientUpdate(node, client_id_of(msg), record_to_state(
                msg.content.array_records[self.arrayrecord_key]), int(weight), 0.0), weight)
        return out

    def _passed(self, replies: list[Message], decoded: Mapping[int, tuple[ClientUpdate, float]],
                screened: GuardedRound) -> list[Message]:
        """The replies the screen steps kept, in their order, each update a step changed
        written back into its reply."""
        after = {u.node_id: u for u in screened.updates}
        passed = []
        for msg in replies:
            node = msg.metadata.src_node_id
            if node not in decoded:
                passed.append(msg)
            elif node in after:
                if after[node].state is not decoded[node][0].state:
                    msg.content[self.arrayrecord_key] = state_to_record(after[node].state)
                passed.append(msg)
        return passed

    def _combined(self, passed: list[Message], screened: GuardedRound,
                  decoded: Mapping[int, tuple[ClientUpdate, float]], own: Mapping[str, Any]
                  ) -> tuple[list[dict[str, NDArray]], list[str], NDArray[np.float64]]:
        """The states the wrapped strategy combined, their client ids and weights: the ones
        it names in ``round_record["weights"]`` (a peer), else every passed reply it did not
        reject, at its count, in the replies' order."""
        by_id = {u.client_id: u for u in screened.updates}
        weights: Mapping[str, float] | None = own.get("weights")
        if weights is None:
            rejected = own.get("rejected", {})
            weights = {u.client_id: decoded[u.node_id][1] for msg in passed
                       if (u := by_id.get(client_id_of(msg))) is not None
                       and u.client_id not in rejected}
        ids = [c for c in weights if c in by_id]
        return ([by_id[c].state for c in ids], ids,
                np.asarray([weights[c] for c in ids], dtype=np.float64))


def _weight(reply: Message, weight_key: str) -> float:
    """The reply's ``weight_key`` metric (Flower's weight; 0 when it sends none)."""
    for metrics in reply.content.metric_records.values():
        value = metrics.get(weight_key)
        return float(value) if isinstance(value, int | float) else 0.0
    return 0.0
