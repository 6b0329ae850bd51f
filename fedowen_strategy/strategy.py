"""FedOwen: a Flower strategy with bandit selection and Shapley-weighted aggregation.

Paper: "FedOwen: Contribution-aware federated learning with Owen sampling" (shared/paper).
``configure_train`` picks clients with the epsilon-greedy bandit of Algorithm 2
(:mod:`~fedowen_strategy.selection`); ``aggregate_train`` guards the returned updates
(:mod:`~fedowen_strategy.guards`), values them with the configured estimator on the server's
evaluation set (:mod:`~fedowen_strategy.contribution`) and averages them with
``softmax(phi / T)`` weights. The class is glue over those modules, the identity roster
(:mod:`~fedowen_strategy.identity`) and the round record (:mod:`~fedowen_strategy.round_record`).

Per-client state (phi, times selected) is keyed by a stable client id that each ClientApp
sends back (``partition-id`` in simulation, a node-config ``client-id`` in deployment). Node
ids are random in every run, so the strategy asks a node it has not heard from for its client
id (a cheap ``query`` message) and selects from the nodes ordered by client id: the same run
config and seed select the same clients in every run. A node that does not answer is keyed
``node:<id>`` (ordered last) and counts as a fresh client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg

from fedowen_strategy.aggregation import weighted_average
from fedowen_strategy.contribution import (
    GAME_METHODS,
    NO_PHI,
    UtilityFactory,
    ValuationSettings,
    resolve_axes,
    value_round,
)
from fedowen_strategy.guards import Guards, guard_round
from fedowen_strategy.identity import IdentityBook, Roster
from fedowen_strategy.nodes import (
    NODE_WAIT_TIMEOUT,
    ROUND_TIMEOUT,
    client_order,
    wait_for_nodes,
)
from fedowen_strategy.replies import (
    parse_replies,
    ray_nodes,
    record_to_state,
    short_label,
    state_to_record,
)
from fedowen_strategy.round_record import ledger_rows, round_metrics, round_record
from fedowen_strategy.selection import (
    SelectionParams,
    select_clients,
    select_uniform,
    update_memory,
)

RoundHook = Callable[[int, dict[str, Any], list[dict[str, Any]]], None]
#: ``(global_state, server_round) -> state``: one server training step (``norm-cap = server``).
ServerStep = Callable[[dict[str, Any], int], dict[str, Any]]
MetricsAggr = Callable[[list[RecordDict], str], MetricRecord]


class FedOwen(FedAvg):
    """FedAvg with Algorithm 2 selection and contribution-weighted aggregation.

    Takes every argument of Flower's ``FedAvg`` with the same meaning, plus those below; every
    default is the app's (the run-config keys of the same names). Each round's ``MetricRecord``
    holds the clients' metrics (``train_metrics_aggr_fn``) and ``phi/<client-id>``,
    ``weight/<client-id>``, ``n-evals``, ``valuation-seconds``, ``num-returned``,
    ``num-failed``, ``num-rejected``.

    Parameters
    ----------
    clients_per_round : int or None
        k, the clients asked to train each round; ``None``: FedAvg's rule from
        ``fraction_train``.
    utility_factory : callable or None
        ``(global_state, client_states, num_examples[, shares]) -> utility(masks) -> values``;
        needed by every game-based method (for torch models:
        ``fedowen_strategy.torch_utility.CoalitionUtility(model, x_eval, y_eval)``).
    valuation, selection_params, guards : ValuationSettings, SelectionParams, Guards
        The estimator and aggregation; Algorithm 2's constants and memory; the update guards.
    selection : {"auto", "adaptive", "random"}
        Algorithm 2 or uniform sampling; ``auto``: adaptive for a valuation method, random
        for ``none`` and ``multikrum``.
    seed : int
        Seeds the selection and valuation generators (independent streams).
    node_wait_timeout, query_timeout : float
        Seconds to wait for k nodes (then a round goes on with at least half of them:
        :func:`fedowen_strategy.nodes.enough_nodes`), and for new nodes to name themselves.
    server_step : callable, optional
        ``(global_state, round) -> state``, the reference of ``guards.norm_cap = "server"``.
    on_round : callable, optional
        ``(round, record, ledger_rows)`` after every aggregation (the ServerApp's records).
    """

    def __init__(self, *, fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
                 min_train_nodes: int = 2, min_evaluate_nodes: int = 2,
                 min_available_nodes: int = 2, weighted_by_key: str = "num-examples",
                 arrayrecord_key: str = "arrays", configrecord_key: str = "config",
                 train_metrics_aggr_fn: MetricsAggr | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggr | None = None,
                 clients_per_round: int | None = None,
                 utility_factory: UtilityFactory | None = None,
                 valuation: ValuationSettings | None = None, selection: str = "auto",
                 selection_params: SelectionParams | None = None, guards: Guards | None = None,
                 seed: int = 0, node_wait_timeout: float = NODE_WAIT_TIMEOUT,
                 query_timeout: float = ROUND_TIMEOUT,
                 server_step: ServerStep | None = None, on_round: RoundHook | None = None
                 ) -> None:
        if clients_per_round is not None and clients_per_round < 1:
            raise ValueError(f"clients_per_round={clients_per_round!r} must be >= 1 (or None "
                             "to derive k from fraction_train)")
        self.valuation = valuation or ValuationSettings()
        if self.valuation.method in GAME_METHODS and utility_factory is None:
            raise ValueError(
                f"valuation={self.valuation.method!r} values coalitions of updates and needs "
                "utility_factory: pass fedowen_strategy.torch_utility.CoalitionUtility(model, "
                "x_eval, y_eval) or your own, or choose valuation 'shapfed-wa', 'none' or "
                "'multikrum'")
        self.guards = guards or Guards()
        self.norm_cap = self.guards.norm_cap_for(self.valuation.method in NO_PHI)
        if self.norm_cap == "server" and server_step is None:
            raise ValueError("norm_cap='server' needs server_step (one server training step on "
                             "the evaluation set); or use norm_cap='median'")
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=min_train_nodes, min_evaluate_nodes=min_evaluate_nodes,
                         min_available_nodes=clients_per_round or min_available_nodes,
                         weighted_by_key=weighted_by_key, arrayrecord_key=arrayrecord_key,
                         configrecord_key=configrecord_key,
                         train_metrics_aggr_fn=train_metrics_aggr_fn,
                         evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)
        self.clients_per_round, self.utility_factory = clients_per_round, utility_factory
        self.selection, _ = resolve_axes(self.valuation.method, selection,
                                         self.valuation.aggregation)
        self.selection_params = selection_params or SelectionParams()
        self.node_wait_timeout, self.query_timeout = node_wait_timeout, query_timeout
        self.server_step, self.on_round = server_step, on_round
        sel_seq, val_seq = np.random.SeedSequence(seed).spawn(2)
        self.select_rng = np.random.default_rng(sel_seq)
        self.value_rng = np.random.default_rng(val_seq)
        self.phi: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.roster = Roster()
        self.linked: set[str] = set()  # client ids caught returning copies of another's update
        self.round_offset = 0
        self._global: ArrayRecord | None = None
        self._connected: list[int] = []
        self._selected: list[str] = []
        self._selected_nodes: list[int] = []

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint (the global model is saved beside it)."""
        return {"phi": dict(self.phi), "counts": dict(self.counts),
                "client_of_node": {str(k): v for k, v in self.client_of_node.items()},
                "linked": sorted(self.linked, key=client_order),
                "select_rng": self.select_rng.bit_generator.state,
                "value_rng": self.value_rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's state. To continue after ``r`` completed rounds also set
        ``round_offset = r``: the next ``start``'s round 1 is then round ``r + 1``."""
        self.phi = {str(k): float(v) for k, v in state["phi"].items()}
        self.counts = {str(k): int(v) for k, v in state["counts"].items()}
        self.roster.book = IdentityBook({int(k): str(v)
                                         for k, v in state["client_of_node"].items()})
        self.linked = {str(c) for c in state.get("linked", [])}  # older checkpoints: none
        self.select_rng.bit_generator.state = state["select_rng"]
        self.value_rng.bit_generator.state = state["value_rng"]

    @property
    def client_of_node(self) -> dict[int, str]:
        """Node id -> the client id bound to it."""
        return self.roster.book.client_of_node

    def summary(self) -> None:
        """Log the settings."""
        k = self.clients_per_round or f"fraction_train={self.fraction_train:g}"
        log(INFO, "FedOwen: k=%s, selection=%s, fraction_evaluate=%g", k, self.selection,
            self.fraction_evaluate)
        for settings in (self.valuation, self.selection_params, self.guards):
            log(INFO, "FedOwen: %s", settings)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Select clients with Algorithm 2 and send them the global model."""
        server_round += self.round_offset
        self._global = arrays
        what = (f"clients-per-round={self.clients_per_round}" if self.clients_per_round
                else "min_available_nodes")
        found = wait_for_nodes(grid, self.min_available_nodes, self.node_wait_timeout, what=what)
        query = RecordDict({self.configrecord_key: ConfigRecord({"identify": 1})})
        self.roster.identify(lambda targets: grid.send_and_receive(self._construct_messages(
            query, targets, MessageType.QUERY), timeout=self.query_timeout), found)
        self._connected = found
        nodes, keys = self.roster.selectable(found, self.linked)
        if not nodes:
            self._selected, self._selected_nodes = [], []
            log(ERROR, "round %d: none of the %d connected nodes may be selected (%d refused "
                "ids, %d client ids linked as copies of each other): the round trains nobody "
                "and keeps the global model. Clients that share data and seed return copies; "
                "give them distinct data, or set duplicate-tolerance = 0", server_round,
                len(found), len(self.roster.refused), len(self.linked))
            return []
        chosen, explored = self._choose(server_round, keys)
        self._selected = [keys[i] for i in chosen]
        self._selected_nodes = [nodes[i] for i in chosen]
        log(INFO, "configure_train: round %d, %s %d of %d clients: %s", server_round,
            "explored" if explored else "exploited", len(chosen), len(nodes),
            ", ".join(short_label(c) for c in self._selected))
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, self._selected_nodes, MessageType.TRAIN)

    def _choose(self, server_round: int, keys: list[str]) -> tuple[np.ndarray, bool]:
        """Indices into ``keys`` of the round's clients, and whether the bandit explored."""
        k = self._k(len(keys))
        if self.selection == "random":
            return select_uniform(len(keys), k, self.select_rng), True
        phi = np.array([self.phi.get(key, 0.0) for key in keys])
        counts = np.array([self.counts.get(key, 0) for key in keys])
        return select_clients(phi, counts, server_round, k, self.selection_params,
                              self.select_rng)

    def _k(self, num_nodes: int) -> int:
        """k: ``clients_per_round``, else FedAvg's rule from ``fraction_train``."""
        if self.clients_per_round is not None:
            return min(self.clients_per_round, num_nodes)
        return min(max(int(num_nodes * self.fraction_train), self.min_train_nodes), num_nodes)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check and guard the replies, value the updates, aggregate with softmax(phi / T)."""
        server_round += self.round_offset
        if self._global is None:
            raise RuntimeError("aggregate_train called before configure_train")
        global_state, replies = record_to_state(self._global), list(replies)
        extra = {"ray_nodes": nodes} if (nodes := ray_nodes(replies)) else {}
        silent = self.roster.silent(replies, self._selected_nodes)
        replies, impostors = self.roster.check(replies, self._connected)
        contents = {r.metadata.src_node_id: r.content for r in replies if not r.has_error()}
        parsed = parse_replies(replies, global_state, arrays_key=self.arrayrecord_key,
                               weight_key=self.weighted_by_key,
                               max_norm_ratio=self.guards.max_norm_ratio)
        parsed.rejected.update(impostors)
        parsed.failed.update(silent)
        step = self.server_step
        guarded = guard_round(parsed.updates, global_state, self.guards, norm_cap=self.norm_cap,
                              value_players=self.valuation.method not in NO_PHI,
                              order=client_order, server_update=None if step is None else (
                                  lambda: step(global_state, server_round)))
        parsed.updates, parsed.clipped = guarded.updates, guarded.clipped
        parsed.rejected.update(guarded.rejected)
        extra.update(guarded.record)
        if guarded.copies:
            self.linked.update(c for g in guarded.copies for c in g)
            log(WARNING, "round %d: copies share one weight and are linked (not selected "
                "again, no payout): %s", server_round, guarded.copies)
        if "links" in extra:
            log(INFO, "round %d: near-parallel updates play as one (cosine > %g): %s",
                server_round, self.guards.link_cosine, extra["links"])
        if not parsed.updates:
            log(WARNING, "round %d: no usable update (%d failed, %d rejected); global model "
                "kept", server_round, len(parsed.failed), len(parsed.rejected))
            record = round_record(self._selected, parsed, self.valuation.method, [], extra, None)
            return None, self._report(server_round, record, [], round_metrics({}, parsed, None))
        states = [u.state for u in parsed.updates]
        val = value_round(states, [u.num_examples for u in parsed.updates], global_state,
                          self.valuation, self.utility_factory, self.value_rng, guarded.groups)
        for upd, phi in zip(parsed.updates, val.phi, strict=True):
            count = self.counts[upd.client_id] = self.counts.get(upd.client_id, 0) + 1
            self.phi[upd.client_id] = update_memory(
                self.phi.get(upd.client_id), float(phi), count, self.selection_params.memory,
                self.selection_params.discount)
        log(INFO, "aggregate_train: round %d, %d updates valued by %s in %.2fs (%d evals)",
            server_round, len(states), self.valuation.method, val.seconds, val.n_evals)
        clients = self._client_metrics([contents[u.node_id] for u in parsed.updates])
        record = round_record(self._selected, parsed, self.valuation.method, guarded.copies,
                              extra, val)
        metrics = round_metrics(clients, parsed, val)
        return (state_to_record(weighted_average(states, val.weights)),
                self._report(server_round, record, ledger_rows(server_round, parsed, val),
                             metrics))

    def _report(self, server_round: int, record: dict[str, Any], rows: list[dict[str, Any]],
                metrics: dict[str, Any]) -> MetricRecord:
        if self.on_round is not None:
            self.on_round(server_round, record, rows)
        return MetricRecord(metrics)

    def _client_metrics(self, contents: list[RecordDict]) -> MetricRecord:
        """The clients' metrics aggregated by ``train_metrics_aggr_fn``; a reply whose metrics
        cannot be aggregated (e.g. a list where others send a number) costs only them."""
        try:
            return self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        except (TypeError, ValueError, KeyError) as err:
            log(WARNING, "client metrics not aggregated this round: %s", err)
            return MetricRecord()

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """FedAvg's aggregation of the clients' evaluation metrics; replies it cannot combine
        cost this round's evaluation metrics only."""
        try:
            return super().aggregate_evaluate(server_round, replies)
        except (TypeError, ValueError, KeyError, InconsistentMessageReplies) as err:
            log(WARNING, "round %d: client evaluation metrics not aggregated: %s",
                server_round, err)
            return None
