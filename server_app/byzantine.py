"""Omniscient attacks, applied at the ServerApp's message boundary (simulation only).

An attack of the table with a server side (``alie``, ``ipm``, ``adaptive``:
:mod:`fedowen_task.adversary.server`) needs the honest clients' updates of the round: the
standard omniscient threat model of Byzantine-robustness benchmarks (Blades, ByzFL), in which
an attack is a function of the honest vectors. A client cannot see them, so the clients of
these kinds train and reply as honest ones, and :class:`ByzantineGrid`, wrapped around the
ServerApp's grid, replaces their replies before any strategy sees them: the attacks act the
same under every strategy (FedOwen's and Flower's) and both backends (``flwr run``'s Ray
simulation, the inline grid).

This module is the attacks' eyes and hands, not the attacks: it decodes the round's train
replies into flat updates ``d_i = trained_i - global`` (floating arrays only, in the model's
float type: :mod:`fedowen_strategy.updates`), shows them to the row's ``server`` function as a
:class:`~fedowen_task.adversary.server.RoundView` together with the defence's bound
(:func:`server_app.attacker_view.attacker_bound`: FedOwen's own
:func:`fedowen_strategy.defences.guards.bound_in_force`, so ``max-norm-ratio``,
``update-bound`` and ``norm-cap`` as the guards apply them) and, for an attacker that knows
the defence list, what its screen steps would keep (:func:`server_app.attacker_view.
screens_admit`), adds
``adversary-jitter`` (:func:`~fedowen_task.adversary.server.jittered`, seeded by (seed,
round, client id)) and encodes the result. Honest statistics come from the round's replies
of non-adversarial clients that carry no error. Integer arrays (counters) come from the
attacker's own reply. Only ``train`` messages are touched; queries and evaluations pass
through, as do bare ``push_messages`` / ``pull_messages`` (every strategy's ``start`` uses
``send_and_receive``). Each attacked round is logged (one INFO line), kept in
:attr:`ByzantineGrid.log` and handed to ``on_round``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid
from numpy.typing import NDArray

from fedowen_strategy.defences.guard_settings import Defence
from fedowen_strategy.replies import ClientUpdate, client_id_of, record_to_state, state_to_record
from fedowen_strategy.updates import (
    State,
    apply_delta,
    flat_delta,
    model_norm,
    update_keys,
    vector_norm,
)
from fedowen_task.adversary.attacks import attack_of, server_side
from fedowen_task.adversary.server import RoundView, jittered
from fedowen_task.protocol import NUM_EXAMPLES_FIELD
from server_app.attacker_view import attacker_bound as attacker_bound  # where tests read it
from server_app.attacker_view import screens_admit
from server_app.config import RunConfig

log = logging.getLogger(__name__)
AttackHook = Callable[[int, dict[str, Any]], None]


@dataclass(frozen=True)
class _Reply:
    """One usable train reply: its message, sender, round and update."""

    message: Message
    client_id: str
    server_round: int
    global_state: dict[str, NDArray]
    state: dict[str, NDArray]
    delta: NDArray
    examples: int


class ByzantineGrid(Grid):
    """A grid that forwards everything to ``inner`` and, in :meth:`send_and_receive`, replaces
    the train replies of the run's adversaries with the server side of their attack (the
    ``server`` function of ``adversary-kind``'s row in :mod:`fedowen_task.adversary.attacks`).

    Parameters
    ----------
    inner : Grid
        The grid the ServerApp was given.
    cfg : RunConfig
        The run config (attack kind and parameters, the defences an adaptive attacker reads).
    num_partitions : int
        Partitions of the simulation; the adversaries are the run's
        (:meth:`fedowen_task.adversary.keys.AdversaryConfig.client_ids`).
    on_round : callable, optional
        Called with ``(server_round, entry)`` for every attacked round (the run's records).
    server_step : callable, optional
        ``(global_state, round) -> state``: the server step that ``norm-cap = "server"``
        takes its reference norm from (the ServerApp passes the strategy's own, cached per
        round), so the adaptive attacker knows that bound as it knows the honest updates.
    defence : (Guards, str), optional
        The strategy's guards and resolved norm cap (:attr:`server_app.strategies.
        ServerStrategy.defence`); None when the strategy has no such guards.
    """

    def __init__(self, inner: Grid, cfg: RunConfig, num_partitions: int,
                 on_round: AttackHook | None = None,
                 server_step: Callable[[State, int], State] | None = None,
                 defence: Defence | None = None) -> None:
        self.adversary = cfg.adversary()
        attack = attack_of(self.adversary).server
        if attack is None:
            raise ValueError(f"adversary-kind={cfg.adversary_kind!r} is not one of "
                             f"{', '.join(server_side())}")
        self.attack = attack
        self.inner, self.cfg, self.on_round = inner, cfg, on_round
        self.server_step, self.defence = server_step, defence
        self.adversaries = self.adversary.client_ids(num_partitions)
        self.log: list[dict[str, Any]] = []
        self._train_calls = 0

    # Everything but send_and_receive is the inner grid's.
    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.inner.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.inner.pull_messages(message_ids)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """The inner grid's replies, those of adversaries to train messages attacked."""
        messages = list(messages)
        sent = _train_globals(messages)  # read before sending: a transport may consume them
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        if sent:
            self._train_calls += 1
            self._attack(replies, sent)
        return replies

    def _attack(self, replies: list[Message], sent: dict[int, tuple[int, State]]) -> None:
        rows = [r for r in (_usable(reply, sent) for reply in replies) if r is not None]
        bad = [r for r in rows if r.client_id in self.adversaries]
        if not bad:
            return
        # An honest reply holding NaN or Inf (a client whose training diverged) is rejected by
        # the strategy before any defence reads it (fedowen_strategy.replies): the attacker
        # reads the round without it, as the defences do (its mean would be NaN otherwise).
        rows = [r for r in rows if r.client_id in self.adversaries or _finite(r.state)]
        honest = [r for r in rows if r.client_id not in self.adversaries]
        server_round = bad[0].server_round or self._train_calls
        width = bad[0].delta.size
        view = RoundView(_stack([r.delta for r in honest], width),
                         _stack([r.delta for r in bad], width), len(rows),
                         [r.examples for r in bad], self._bound(rows, honest, bad, server_round),
                         self._admits(honest, bad, server_round)
                         if self.adversary.knows == "defences" else None)
        deltas, params = self.attack(view, self.adversary)
        if self.adversary.jitter > 0:
            deltas = jittered(deltas, self.adversary.jitter, self.adversary.seed, server_round,
                              [r.client_id for r in bad])
            params["jitter"] = self.adversary.jitter
        for row, delta in zip(bad, deltas, strict=True):
            row.message.content["arrays"] = state_to_record(apply_delta(
                row.global_state, delta, update_keys(row.global_state), others=row.state))
        entry = {"round": server_round, "kind": self.adversary.kind,
                 "clients": [r.client_id for r in bad], "replies": len(rows),
                 "honest": len(honest), **params,
                 "norms": [vector_norm(d) for d in deltas]}
        self.log.append(entry)
        log.info("round %d: %s attack by clients %s (%d of %d replies; %s): sent update "
                 "norm(s) %s", server_round, entry["kind"], ", ".join(entry["clients"]),
                 len(bad), len(rows), _describe(params),
                 ", ".join(f"{v:.4g}" for v in entry["norms"]))
        if self.on_round is not None:
            self.on_round(server_round, entry)

    def _bound(self, rows: list[_Reply], honest: list[_Reply], bad: list[_Reply],
               server_round: int) -> Callable[[int], float | None]:
        """The round's :func:`attacker_bound` for an attacker update of so many examples,
        worked out (and the server step taken) only when the attack asks."""
        global_state = bad[0].global_state

        @cache
        def facts() -> dict[str, Any]:
            return {"norms": [vector_norm(r.delta) for r in rows],
                    "examples": [r.examples for r in rows],
                    "global_norm": model_norm(global_state),
                    "server_norm": self._server_norm(global_state, server_round),
                    "others": [vector_norm(r.delta) for r in honest]}

        def bound(own_examples: int) -> float | None:
            return attacker_bound(self.defence, own_examples=own_examples, attackers=len(bad),
                                  **facts())
        return bound

    def _admits(self, honest: list[_Reply], bad: list[_Reply], server_round: int
                ) -> Callable[[NDArray], list[bool]]:
        """:func:`~server_app.attacker_view.screens_admit` for the round's attackers."""
        def update(r: _Reply, state: State) -> ClientUpdate:
            return ClientUpdate(r.message.metadata.src_node_id, r.client_id, dict(state),
                                r.examples, 0.0)
        global_state = bad[0].global_state
        keys = update_keys(global_state)
        return screens_admit(
            self.cfg, self.defence, global_state, [update(r, r.state) for r in honest],
            lambda deltas: [update(r, apply_delta(global_state, d, keys, others=r.state))
                            for r, d in zip(bad, deltas, strict=True)], server_round)

    def _server_norm(self, global_state: State, server_round: int) -> float | None:
        """The norm of the round's server step, the reference of ``norm-cap = "server"``
        (None under any other cap, or without a server step)."""
        if self.server_step is None or self.defence is None or self.defence[1] != "server":
            return None
        step = self.server_step(global_state, server_round)
        return vector_norm(flat_delta(step, global_state))


def _describe(params: Mapping[str, Any]) -> str:
    parts = []
    for key, value in params.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        elif isinstance(value, list):
            parts.append(f"{key}=[{', '.join('-' if v is None else f'{v:.4g}' for v in value)}]")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def _stack(vectors: list[NDArray], width: int) -> NDArray:
    return np.stack(vectors) if vectors else np.empty((0, width))


def _train_globals(messages: list[Message]) -> dict[int, tuple[int, State]]:
    """Destination node -> (server round, global model) of every train message."""
    out: dict[int, tuple[int, State]] = {}
    decoded: dict[int, State] = {}  # one decoding per ArrayRecord (shared by a round's messages)
    for msg in messages:
        if (msg.metadata.message_type.split(".")[0] != MessageType.TRAIN
                or not msg.has_content() or "arrays" not in msg.content.array_records):
            continue
        record = msg.content.array_records["arrays"]
        if id(record) not in decoded:
            decoded[id(record)] = record_to_state(record)
        config = msg.content.config_records.get("config")
        server_round = config.get("server-round", 0) if config is not None else 0
        out[msg.metadata.dst_node_id] = (server_round if isinstance(server_round, int) else 0,
                                         decoded[id(record)])
    return out


def _finite(state: State) -> bool:
    """Whether every floating array of ``state`` is finite (the strategy's check of a reply)."""
    return all(np.all(np.isfinite(a)) for a in state.values()
               if np.issubdtype(np.asarray(a).dtype, np.floating))


def _usable(reply: Message, sent: Mapping[int, tuple[int, State]]) -> _Reply | None:
    """The reply's update, or None when it is an error, answers no train message or does not
    match its global model (the strategy then judges it as it is)."""
    node = reply.metadata.src_node_id
    if reply.has_error() or not reply.has_content() or node not in sent:
        return None
    if "arrays" not in reply.content.array_records:
        return None
    server_round, global_state = sent[node]
    state = record_to_state(reply.content.array_records["arrays"])
    if list(state) != list(global_state) or any(
            state[k].shape != v.shape or state[k].dtype != v.dtype
            for k, v in global_state.items()):
        return None
    metrics = next(iter(reply.content.metric_records.values()), None)
    count = metrics.get(NUM_EXAMPLES_FIELD, 0) if metrics is not None else 0
    examples = (int(count) if isinstance(count, int | float) and math.isfinite(count)
                and count > 0 else 0)
    return _Reply(reply, client_id_of(reply), server_round, dict(global_state), state,
                  flat_delta(state, global_state), examples)
