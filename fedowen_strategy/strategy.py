"""FedOwen: a Flower strategy with bandit selection and Shapley-weighted aggregation.

Paper: "FedOwen: Contribution-aware federated learning with Owen sampling" (shared/paper).
``configure_train`` picks clients with the epsilon-greedy bandit of Algorithm 2
(:mod:`fedowen_strategy.selection`); ``aggregate_train`` values every returned update with the
configured estimator on the server's evaluation set (:mod:`fedowen_strategy.contribution`,
truncated Owen sampling by default) and averages the updates with ``softmax(phi / T)`` weights
(:mod:`fedowen_strategy.aggregation`). The strategy itself is thin glue over those modules.

Per-client state (latest phi, times selected) is keyed by a stable client id that each
ClientApp sends back (``partition-id`` in simulation, a node-config ``client-id`` in
deployment), so it is meaningful across restarts. Node ids are random in every run, so before
it selects from a node it has not heard from, the strategy asks it for its client id with a
cheap ``query`` message, and it always selects from the nodes ordered by client id: the same
run config and seed select the same clients in every run. A node that does not answer is
keyed ``node:<id>`` (ordered last) and counts as a fresh client.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg

from fedowen_strategy.aggregation import duplicate_groups, weighted_average
from fedowen_strategy.bounds import (
    NORM_CAPS,
    BoundedRound,
    bound_updates,
    cap_norms,
    lower_median,
    update_norm,
)
from fedowen_strategy.contribution import (
    GAME_METHODS,
    NO_PHI,
    RoundValuation,
    UtilityFactory,
    ValuationSettings,
    resolve_axes,
    value_round,
)
from fedowen_strategy.identity import IdentityBook
from fedowen_strategy.links import cosine_matrix, link_groups, merge_groups, upper_triangle
from fedowen_strategy.nodes import client_order, wait_for_nodes
from fedowen_strategy.replies import (
    ParsedReplies,
    client_id_of,
    parse_replies,
    ray_nodes,
    record_to_state,
    short_label,
    state_to_record,
)
from fedowen_strategy.selection import (
    SelectionParams,
    select_clients,
    select_uniform,
    update_memory,
)

RoundHook = Callable[[int, dict[str, Any], list[dict[str, Any]]], None]
#: ``(global_state, server_round) -> state``: one server training step (``norm-cap = server``).
ServerStep = Callable[[dict[str, Any], int], dict[str, Any]]
#: What a Flower ClientApp answers to a message type it registered no function for.
NO_QUERY_HANDLER = "No query function registered"
#: Rounds of at most this many updates record their pairwise cosines.
RECORD_COSINES_UP_TO = 32
MetricsAggr = Callable[[list[RecordDict], str], MetricRecord]


class FedOwen(FedAvg):
    """FedAvg with Algorithm 2 selection and contribution-weighted aggregation.

    Takes every argument of Flower's ``FedAvg`` (``fraction_train``, ``fraction_evaluate``,
    ``min_*_nodes``, the record keys, ``train_metrics_aggr_fn``, ``evaluate_metrics_aggr_fn``)
    with the same meaning, plus the parameters below. Each round's ``MetricRecord`` (in the
    ``Result``'s ``train_metrics_clientapp``) holds the clients' metrics aggregated by
    ``train_metrics_aggr_fn`` and ``phi/<client-id>``, ``weight/<client-id>``, ``n-evals``,
    ``valuation-seconds``, ``num-returned``, ``num-failed``, ``num-rejected``.

    Parameters
    ----------
    clients_per_round : int or None
        k, the number of clients asked to train each round; ``None``: like FedAvg,
        ``max(int(connected * fraction_train), min_train_nodes)``.
    utility_factory : callable or None
        ``(global_state, client_states, num_examples) -> utility(masks) -> values``; needed
        by every game-based valuation method (a ready one for torch models:
        ``fedowen_strategy.torch_utility.CoalitionUtility(model, x_eval, y_eval)``).
    valuation : ValuationSettings
        Estimator, budget M, parameters, phi scale and softmax temperature.
    selection : {"auto", "adaptive", "random"}
        Algorithm 2, or uniform sampling (FedAvg's; the paper's ablation). ``auto``: adaptive
        for a valuation method, random for ``none`` and ``multikrum`` (which compute no phi).
    selection_params : SelectionParams
        epsilon, c, tau of Algorithm 2.
    seed : int
        Seeds the selection and valuation generators (independent streams).
    max_norm_ratio : float
        Reject updates farther from the global model than this multiple of its norm (0: off).
    node_wait_timeout : float
        Seconds to wait for k nodes (``clients_per_round``, else ``min_available_nodes``);
        then a round goes on with at least half of them and fails with fewer, saying how many
        are connected and how to add nodes (:func:`fedowen_strategy.nodes.enough_nodes`).
    query_timeout : float
        Seconds to wait for new nodes to name themselves (their client ids).
    duplicate_tolerance : float
        Updates within this relative distance of each other are copies
        (:func:`fedowen_strategy.aggregation.duplicate_groups`; 0 turns the check off): in the
        round they are caught, a group of copies gets one member's weight (and one member's
        share in the delta game), and its client ids are *linked*: never selected again, and
        the payout ledger forfeits their pay (:mod:`fedowen_strategy.payouts`). Keep it at
        copy level: under one-class non-IID data honest updates came within 0.0007 of each
        other (docs/results/duplicates/).
    bandit_memory, bandit_discount : str, float
        What the bandit exploits per client: the running mean of its phi (default), its
        latest phi (Algorithm 2), or a discounted mean
        (:func:`fedowen_strategy.selection.update_memory`).
    update_bound : {"none", "clip", "reject"}
        Bound every update by ``update_bound_multiple`` x the round's lower-median update
        norm per example (:mod:`fedowen_strategy.bounds`): clip it to that norm or reject it.
    update_bound_multiple : float
        The multiple of that median the bound allows (> 1).
    norm_cap : {"none", "median", "server"}
        Norm normalisation, before valuation and aggregation: every update is rescaled to at
        most ``norm_cap_multiple`` x a reference norm, the round's lower-median update norm
        (``median``) or the norm of ``server_step``'s update (``server``)
        (:func:`fedowen_strategy.bounds.cap_norms`).
    server_step : callable, optional
        ``(global_state, round) -> state``, e.g. one epoch on the evaluation set; needed by
        ``norm_cap = "server"``.
    link_cosine : float
        Updates with pairwise cosine above it are linked into one player of the game, their
        phi and weight split among them (:mod:`fedowen_strategy.links`; 0: off). Applies to
        methods that compute contributions.
    on_round : callable, optional
        ``(round, record, ledger_rows)`` called after every aggregation (the ServerApp writes
        the records with it).
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
                 selection_params: SelectionParams | None = None, seed: int = 0,
                 max_norm_ratio: float = 0.0, node_wait_timeout: float = 60.0,
                 query_timeout: float = 300.0, duplicate_tolerance: float = 0.0,
                 bandit_memory: str = "mean", bandit_discount: float = 0.3,
                 update_bound: str = "none", update_bound_multiple: float = 3.0,
                 norm_cap: str = "none", norm_cap_multiple: float = 1.0,
                 server_step: ServerStep | None = None, link_cosine: float = 0.0,
                 on_round: RoundHook | None = None) -> None:
        if clients_per_round is not None and clients_per_round < 1:
            raise ValueError(f"clients_per_round={clients_per_round!r} must be >= 1 (or None "
                             "to derive k from fraction_train)")
        valuation = valuation or ValuationSettings()
        if valuation.method in GAME_METHODS and utility_factory is None:
            raise ValueError(
                f"valuation={valuation.method!r} values coalitions of updates and needs "
                "utility_factory: pass fedowen_strategy.torch_utility.CoalitionUtility(model, "
                "x_eval, y_eval) or your own, or choose valuation 'shapfed-wa', 'none' or "
                "'multikrum'")
        selection, _ = resolve_axes(valuation.method, selection, valuation.aggregation)
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=min_train_nodes, min_evaluate_nodes=min_evaluate_nodes,
                         min_available_nodes=clients_per_round or min_available_nodes,
                         weighted_by_key=weighted_by_key, arrayrecord_key=arrayrecord_key,
                         configrecord_key=configrecord_key,
                         train_metrics_aggr_fn=train_metrics_aggr_fn,
                         evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)
        self.clients_per_round = clients_per_round
        self.utility_factory = utility_factory
        self.valuation = valuation
        self.selection = selection
        self.selection_params = selection_params or SelectionParams()
        self.max_norm_ratio = max_norm_ratio
        self.node_wait_timeout, self.query_timeout = node_wait_timeout, query_timeout
        if duplicate_tolerance < 0:
            raise ValueError(f"duplicate_tolerance={duplicate_tolerance!r} must be >= 0")
        self.duplicate_tolerance = duplicate_tolerance
        update_memory(None, 0.0, 1, bandit_memory, bandit_discount)  # validates both
        self.bandit_memory, self.bandit_discount = bandit_memory, bandit_discount
        bound_updates([], {}, update_bound, update_bound_multiple)  # validates both
        self.update_bound, self.update_bound_multiple = update_bound, update_bound_multiple
        if norm_cap not in NORM_CAPS[1:] or not norm_cap_multiple > 0:
            raise ValueError(f"norm_cap={norm_cap!r} must be one of {NORM_CAPS[1:]} and "
                             f"norm_cap_multiple={norm_cap_multiple!r} > 0")
        if norm_cap == "server" and server_step is None:
            raise ValueError("norm_cap='server' needs server_step (one server training step on "
                             "the evaluation set); or use norm_cap='median'")
        self.norm_cap, self.norm_cap_multiple = norm_cap, norm_cap_multiple
        self.server_step = server_step
        link_groups(np.zeros((0, 0)), link_cosine)  # validates it
        self.link_cosine = link_cosine
        self.on_round = on_round
        sel_seq, val_seq = np.random.SeedSequence(seed).spawn(2)
        self.select_rng = np.random.default_rng(sel_seq)
        self.value_rng = np.random.default_rng(val_seq)
        self.phi: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.identities = IdentityBook()
        self.refused: set[int] = set()  # nodes that claimed another connected node's id
        # ClientApps without a query handler (Flower's quickstart): asked once, then never
        self.queries_unanswered = False
        self.linked: set[str] = set()  # client ids caught returning copies of another's update
        self._connected: list[int] = []
        self.round_offset = 0
        self._global: ArrayRecord | None = None
        self._selected: list[str] = []
        self._duplicates: list[list[str]] = []
        self._round_extra: dict[str, Any] = {}
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
        ``round_offset = r``: the next ``start``'s round 1 is then round ``r + 1`` for
        selection, seeds and records (the ServerApp's Flower strategies take the same
        attribute)."""
        self.phi = {str(k): float(v) for k, v in state["phi"].items()}
        self.counts = {str(k): int(v) for k, v in state["counts"].items()}
        self.identities = IdentityBook({int(k): str(v)
                                        for k, v in state["client_of_node"].items()})
        self.linked = {str(c) for c in state.get("linked", [])}  # older checkpoints: none
        self.select_rng.bit_generator.state = state["select_rng"]
        self.value_rng.bit_generator.state = state["value_rng"]

    @property
    def client_of_node(self) -> dict[int, str]:
        """Node id -> the client id bound to it."""
        return self.identities.client_of_node

    def summary(self) -> None:
        """Log the settings."""
        v, p = self.valuation, self.selection_params
        k = self.clients_per_round or f"fraction_train={self.fraction_train:g}"
        log(INFO, "FedOwen: k=%s, valuation=%s (M=%d, params=%s, phi-scale=%s), aggregation=%s "
            "(T=%g)", k, v.method, v.budget_m, dict(v.params), v.phi_scale, v.aggregation,
            v.temperature)
        log(INFO, "FedOwen: selection=%s (epsilon=%g, c=%g, tau=%g), max-norm-ratio=%g, "
            "fraction_evaluate=%g, update-bound=%s (%g x the round's median norm per example)",
            self.selection, p.epsilon, p.c, p.tau, self.max_norm_ratio, self.fraction_evaluate,
            self.update_bound, self.update_bound_multiple)
        log(INFO, "FedOwen: norm-cap=%s (x%g), link-cosine=%g", self.norm_cap,
            self.norm_cap_multiple, self.link_cosine)

    def _identify(self, grid: Grid, nodes: list[int]) -> None:
        """Ask nodes not heard from yet for their client ids (one ``query`` message each).

        While nobody has been named, one node is asked first: a ClientApp without a query
        handler (Flower's quickstart registers only train and evaluate) answers with an error,
        which is logged once, and no node is asked again. Client ids then come from the train
        replies where a ClientApp sends one, else nodes are labelled by node id.
        """
        unknown = [node for node in nodes if node not in self.client_of_node]
        if not unknown or self.queries_unanswered:
            return
        record = RecordDict({self.configrecord_key: ConfigRecord({"identify": 1})})
        if not self.client_of_node:  # probe one node before asking everyone
            first = self._query(grid, record, unknown[:1], nodes)
            if self.queries_unanswered:
                return
            named = first + self._query(grid, record, unknown[1:], nodes)
        else:
            named = self._query(grid, record, unknown, nodes)
        log(INFO, "Identified %d of %d new nodes by client id", named, len(unknown))

    def _query(self, grid: Grid, record: RecordDict, targets: list[int],
               nodes: list[int]) -> int:
        """Send the identity query to ``targets``; how many named themselves."""
        if not targets:
            return 0
        replies = grid.send_and_receive(
            self._construct_messages(record, targets, MessageType.QUERY),
            timeout=self.query_timeout)
        named = 0
        for reply in replies:
            if reply.has_error():
                reason = (reply.error.reason or "").strip()
                if NO_QUERY_HANDLER in reason and not self.queries_unanswered:
                    self.queries_unanswered = True
                    log(INFO, "The ClientApp answers no query (%s): clients are labelled by "
                        "the client id their train replies carry, else by node id; no node is "
                        "asked again", reason.splitlines()[-1][:120])
                continue
            node = reply.metadata.src_node_id
            refused = self.identities.claim(node, client_id_of(reply), nodes)
            if refused:
                log(WARNING, "identity refused: %s; node %d is not selected", refused, node)
                self.refused.add(node)
            else:
                named += 1
        return named

    def _keys(self, nodes: list[int]) -> tuple[list[int], list[str]]:
        """Selectable nodes and their client ids, ordered by client id (numbers numerically);
        refused nodes and linked client ids are left out."""
        keyed = [(self.client_of_node.get(node, f"node:{node}"), node) for node in nodes
                 if node not in self.refused]
        keyed = [(key, node) for key, node in keyed if key not in self.linked]
        keyed.sort(key=lambda kn: client_order(kn[0]))
        return [n for _, n in keyed], [k for k, _ in keyed]

    def _k(self, num_nodes: int) -> int:
        """k: ``clients_per_round``, else FedAvg's rule from ``fraction_train``."""
        if self.clients_per_round is not None:
            return min(self.clients_per_round, num_nodes)
        return min(max(int(num_nodes * self.fraction_train), self.min_train_nodes), num_nodes)

    def _choose(self, server_round: int, keys: list[str]) -> tuple[np.ndarray, bool]:
        k = self._k(len(keys))
        if self.selection == "random":
            return select_uniform(len(keys), k, self.select_rng), True
        phi = np.array([self.phi.get(key, 0.0) for key in keys])
        counts = np.array([self.counts.get(key, 0) for key in keys])
        return select_clients(phi, counts, server_round, k, self.selection_params,
                              self.select_rng)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Select clients with Algorithm 2 and send them the global model."""
        server_round += self.round_offset
        self._global = arrays
        what = (f"clients-per-round={self.clients_per_round}" if self.clients_per_round
                else "min_available_nodes")
        found = wait_for_nodes(grid, self.min_available_nodes, self.node_wait_timeout, what=what)
        self._identify(grid, found)
        self._connected = found
        nodes, keys = self._keys(found)
        if not nodes:
            self._selected, self._selected_nodes = [], []
            log(ERROR, "round %d: none of the %d connected nodes may be selected (%d refused "
                "ids, %d client ids linked as copies of each other): the round trains nobody "
                "and keeps the global model. Clients that share data and seed return copies; "
                "give them distinct data, or set duplicate-tolerance = 0", server_round,
                len(found), len(self.refused), len(self.linked))
            return []
        chosen, explored = self._choose(server_round, keys)
        self._selected = [keys[i] for i in chosen]
        self._selected_nodes = [nodes[i] for i in chosen]
        log(INFO, "configure_train: round %d, %s %d of %d clients: %s", server_round,
            "explored" if explored else "exploited", len(chosen), len(nodes),
            ", ".join(short_label(c) for c in self._selected))
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, [nodes[i] for i in chosen], MessageType.TRAIN)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, value the updates, aggregate with softmax(phi / T)."""
        server_round += self.round_offset
        if self._global is None:
            raise RuntimeError("aggregate_train called before configure_train")
        global_state = record_to_state(self._global)
        replies = list(replies)
        if nodes := ray_nodes(replies):  # which machine of a Ray cluster trained whom
            self._round_extra["ray_nodes"] = nodes
        silent = self._silent(replies)
        replies, impostors = self._check_identities(replies)
        contents = {r.metadata.src_node_id: r.content for r in replies if not r.has_error()}
        parsed = parse_replies(replies, global_state, arrays_key=self.arrayrecord_key,
                               weight_key=self.weighted_by_key,
                               max_norm_ratio=self.max_norm_ratio)
        parsed.rejected.update(impostors)
        parsed.failed.update(silent)
        bounded = bound_updates(parsed.updates, global_state, self.update_bound,
                                self.update_bound_multiple)
        parsed.updates, parsed.clipped = bounded.updates, bounded.clipped
        parsed.rejected.update(bounded.rejected)
        capped = self._cap(parsed.updates, global_state, server_round)
        parsed.updates = capped.updates
        # Replies arrive in any order; value and average them in client-id order, so the
        # estimator's sampled orders (and float sums) do not depend on arrival times.
        parsed.updates.sort(key=lambda upd: client_order(upd.client_id))
        if not parsed.updates:
            log(WARNING, "round %d: no usable update (%d failed, %d rejected); global model "
                "kept", server_round, len(parsed.failed), len(parsed.rejected))
            return None, self._report(server_round, parsed, None, [], MetricRecord())
        states = [u.state for u in parsed.updates]
        examples = [u.num_examples for u in parsed.updates]
        groups = self._groups(parsed, global_state, server_round)
        val = value_round(states, examples, global_state, self.valuation, self.utility_factory,
                          self.value_rng, groups)
        for upd, phi in zip(parsed.updates, val.phi, strict=True):
            count = self.counts.get(upd.client_id, 0) + 1
            self.counts[upd.client_id] = count
            self.phi[upd.client_id] = update_memory(self.phi.get(upd.client_id), float(phi),
                                                    count, self.bandit_memory,
                                                    self.bandit_discount)
        new_state = weighted_average(states, val.weights)
        client_metrics = self._client_metrics([contents[u.node_id] for u in parsed.updates])
        metrics = self._report(server_round, parsed, val, examples, client_metrics)
        return state_to_record(new_state), metrics

    def _cap(self, updates: list[Any], global_state: dict[str, Any], server_round: int
             ) -> BoundedRound:
        """Norm normalisation (``norm_cap``); the cap and the factors go to the round record."""
        if self.norm_cap == "none" or not updates:
            return BoundedRound(list(updates))
        if self.norm_cap == "server" and self.server_step is not None:
            reference: float | None = update_norm(self.server_step(global_state, server_round),
                                                  global_state)
        else:
            reference = lower_median([update_norm(u.state, global_state) for u in updates])
        cap = None if not reference else self.norm_cap_multiple * reference
        capped = cap_norms(updates, global_state, cap)
        self._round_extra.update(norm_cap=cap, capped=capped.clipped)
        return capped

    def _groups(self, parsed: ParsedReplies, global_state: dict[str, Any],
                server_round: int) -> list[list[int]]:
        """Copies (banned: linked for good) merged with near-parallel updates (one player
        of the game); the round record gets both, and the pairwise cosines."""
        states = [u.state for u in parsed.updates]
        ids = [u.client_id for u in parsed.updates]
        copies = duplicate_groups(states, global_state, self.duplicate_tolerance)
        if copies:
            self._duplicates = [[ids[i] for i in g] for g in copies]
            self.linked.update(c for g in self._duplicates for c in g)
            log(WARNING, "round %d: copies share one weight and are linked (not selected "
                "again, no payout): %s", server_round, self._duplicates)
        if self.valuation.method in NO_PHI or len(states) < 2:
            return copies
        cosines = cosine_matrix(states, global_state)
        if len(states) <= RECORD_COSINES_UP_TO:  # the honest pairs' distribution (links)
            self._round_extra["cosines"] = upper_triangle(cosines)
        near = link_groups(cosines, self.link_cosine)
        if near:
            self._round_extra["links"] = [[ids[i] for i in g] for g in near]
            log(INFO, "round %d: near-parallel updates play as one (cosine > %g): %s",
                server_round, self.link_cosine, self._round_extra["links"])
        return merge_groups(len(states), copies, near)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """FedAvg's aggregation of the clients' evaluation metrics; replies it cannot combine
        (e.g. a list where others send a number) cost this round's evaluation metrics only."""
        try:
            return super().aggregate_evaluate(server_round, replies)
        except (TypeError, ValueError, KeyError, InconsistentMessageReplies) as err:
            log(WARNING, "round %d: client evaluation metrics not aggregated: %s",
                server_round, err)
            return None

    def _client_metrics(self, contents: list[RecordDict]) -> MetricRecord:
        """The clients' metrics aggregated by ``train_metrics_aggr_fn``; a reply whose metrics
        cannot be aggregated (e.g. a list where others send a number) costs only them."""
        try:
            return self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        except (TypeError, ValueError, KeyError) as err:
            log(WARNING, "client metrics not aggregated this round: %s", err)
            return MetricRecord()

    def _silent(self, replies: list[Message]) -> dict[str, str]:
        """Selected nodes that sent no reply (timed out, disconnected): counted as failed."""
        replied = {msg.metadata.src_node_id for msg in replies}
        silent = {}
        for node in self._selected_nodes:
            if node not in replied:
                who = self.client_of_node.get(node, f"node:{node}")
                silent[who] = "no reply within round-timeout (timed out or disconnected)"
                log(WARNING, "client %s (node %d) sent no reply this round", who, node)
        return silent

    def _check_identities(self, replies: Iterable[Message]
                          ) -> tuple[list[Message], dict[str, str]]:
        """Replies whose claimed id matches their node's binding, and the refused ones
        (keyed ``node:<id>`` by the claiming node, so the victim is not blamed)."""
        kept, refused = [], {}
        for msg in replies:
            node = msg.metadata.src_node_id
            reason = None if msg.has_error() else self.identities.claim(
                node, client_id_of(msg), self._connected)
            if reason:
                refused[f"node:{node}"] = reason
                log(WARNING, "rejected a reply: %s", reason)
            else:
                kept.append(msg)
        return kept, refused

    def _report(self, server_round: int, parsed: ParsedReplies, val: RoundValuation | None,
                examples: list[int], client_metrics: MetricRecord) -> MetricRecord:
        """Call ``on_round`` with the round's record; the round's MetricRecord."""
        ids = [u.client_id for u in parsed.updates]
        record: dict[str, Any] = {
            "selected": list(self._selected), "returned": ids,
            "failed": parsed.failed, "rejected": parsed.rejected, "clipped": parsed.clipped,
            "valuation": self.valuation.method,
        }
        if self._duplicates:
            record["duplicates"], self._duplicates = self._duplicates, []
        record.update(self._round_extra)
        self._round_extra = {}
        rows: list[dict[str, Any]] = []
        metrics = MetricRecord({k: v for k, v in client_metrics.items()
                                if not isinstance(v, float) or math.isfinite(v)})
        metrics.update({"num-returned": len(ids), "num-failed": len(parsed.failed),
                        "num-rejected": len(parsed.rejected)})
        if val is not None:
            record.update(phi=dict(zip(ids, val.phi.tolist(), strict=True)),
                          phi_raw=dict(zip(ids, val.phi_raw.tolist(), strict=True)),
                          weights=dict(zip(ids, val.weights.tolist(), strict=True)),
                          n_evals=val.n_evals, valuation_seconds=val.seconds,
                          nu_empty=val.nu_empty, nu_full=val.nu_full)
            metrics.update({"n-evals": val.n_evals, "valuation-seconds": val.seconds})
            for cid, phi, weight in zip(ids, val.phi, val.weights, strict=True):
                if math.isfinite(phi):
                    metrics[f"phi/{cid}"] = float(phi)
                metrics[f"weight/{cid}"] = float(weight)
            rows = [{"client_id": c, "round": server_round, "phi": p, "phi_raw": r,
                     "weight": w, "num_examples": e}
                    for c, p, r, w, e in zip(ids, val.phi, val.phi_raw, val.weights, examples,
                                             strict=True)]
            log(INFO, "aggregate_train: round %d, %d updates valued by %s in %.2fs (%d evals)",
                server_round, len(ids), self.valuation.method, val.seconds, val.n_evals)
        if self.on_round is not None:
            self.on_round(server_round, record, rows)
        return metrics
