"""FedOwen: a Flower strategy with client selection and Shapley-weighted aggregation.

Paper: "FedOwen: Contribution-aware federated learning with Owen sampling" (shared/paper). The
class is glue over pure parts: the run's selector behind the identity cap and the link groups
(:mod:`~fedowen_strategy.selectors`: Algorithm 2's bandit by default; the strategy calls the
selector protocol and names no selector),
the identity roster (:mod:`~fedowen_strategy.defences.identity`: clients are keyed by the stable id
each ClientApp sends, asked for with a ``query`` message, and selected in id order, so a run
config and seed select the same clients in every run) and one aggregation round
(:func:`~fedowen_strategy.round.round_step.aggregate_round`: the update guards, the valuation, the
softmax weights and the round record).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache, partial
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg, Result
from numpy.typing import NDArray

from fedowen_strategy import nodes, replies
from fedowen_strategy.defences.base import Dispatching, Gate, Guard, dispatch_model, refuse_replies
from fedowen_strategy.defences.guard_settings import Defence, Guards
from fedowen_strategy.defences.identity import IdentityBook, Roster
from fedowen_strategy.defences.table import build, in_force
from fedowen_strategy.fedavg_args import takes_fedavg_arguments
from fedowen_strategy.round import round_record
from fedowen_strategy.round.contribution import UtilityFactory, ValuationSettings, resolve_auto
from fedowen_strategy.round.round_step import aggregate_round
from fedowen_strategy.selectors import registry
from fedowen_strategy.selectors.base import AskClients, ConfigValue, Seen, SelectorSettings
from fedowen_strategy.selectors.shared import SelectionParams, round_size

log = logging.getLogger(__name__)

RoundHook = Callable[[int, dict[str, Any], list[dict[str, Any]]], None]
EvaluateHook = Callable[[int, dict[str, Any]], None]
#: ``(global_state, server_round) -> state``: one server training step (``norm-cap = server``).
ServerStep = Callable[[Mapping[str, NDArray], int], Mapping[str, NDArray]]
MetricsAggr = Callable[[list[RecordDict], str], MetricRecord]


class FedOwen(FedAvg):
    """FedAvg with client selection (Algorithm 2 by default) and contribution-weighted
    aggregation.

    Takes every argument of Flower's ``FedAvg``, plus those below; every default is the app's
    (the run-config keys of the same names). A round's ``MetricRecord`` adds ``phi/<id>``,
    ``weight/<id>``, ``n-evals``, ``valuation-seconds`` and the reply counts.

    Parameters
    ----------
    clients_per_round : int or None
        k; ``None``: FedAvg's rule from ``fraction_train``. When set, it is also FedAvg's
        ``min_available_nodes`` (the strategy waits for k nodes).
    utility_factory : callable or None
        ``(global_state, client_states, num_examples[, shares]) -> utility(masks)``; needed by
        every game-based method (torch: :class:`~fedowen_strategy.torch_utility.
        CoalitionUtility`).
    valuation, selection_params, guards : ValuationSettings, SelectionParams, Guards
        The estimator and aggregation; what every selector shares (the identity cap, the link
        memory); the update guards' settings.
    defences : str or sequence of str or Guard
        The defence list, applied in order (:mod:`fedowen_strategy.defences.table`): ``auto``
        (FedOwen's list, :data:`~fedowen_strategy.defences.table.FEDOWEN_DEFENCES`), names of
        the table's rows, or :class:`~fedowen_strategy.defences.base.Guard` objects.
    selection : str or SelectorSettings
        A name in :data:`~fedowen_strategy.selectors.registry.SELECTORS` (with its default
        settings), a selector's settings (e.g. ``PowerOfChoiceSettings(poc_d=50)``), or
        ``auto``: adaptive for a valuation method, random for ``none`` and ``multikrum``
        (``choices``, with the aggregation and norm cap: :func:`~fedowen_strategy.round.
        contribution.resolve_auto`). A selector may ask clients before it chooses (``query``
        messages) and ask the trained clients for more in the train config. A key whose
        default is the run's length (``hics-rounds = 0``) resolves in :meth:`start`.
    fraction_evaluate : float
        Federated evaluation's share of the nodes, as in ``FedAvg`` but off by default as in
        the app (whose ServerApp evaluates centrally).
    seed : int
        Seeds the selection and valuation streams.
    node_wait_timeout, query_timeout : float
        Seconds to wait for k nodes (then at least half: :func:`~fedowen_strategy.nodes.
        enough_nodes`) and for new nodes to name themselves.
    server_step : callable, optional
        ``(global_state, round) -> state``, the reference of ``norm_cap = "server"``.
    on_round, on_evaluate : callable, optional
        ``(round, record, ledger_rows)`` after every aggregation (the ServerApp's store);
        ``(round, metrics)`` after every federated evaluation (``fraction_evaluate > 0``).
    """

    @takes_fedavg_arguments
    def __init__(self, *, clients_per_round: int | None = None,
                 utility_factory: UtilityFactory | None = None,
                 valuation: ValuationSettings | None = None,
                 selection: str | SelectorSettings = "auto",
                 selection_params: SelectionParams | None = None, guards: Guards | None = None,
                 defences: str | Sequence[str | Guard] = "auto", seed: int = 0,
                 node_wait_timeout: float = nodes.NODE_WAIT_TIMEOUT,
                 query_timeout: float = nodes.ROUND_TIMEOUT,
                 server_step: ServerStep | None = None, on_round: RoundHook | None = None,
                 on_evaluate: EvaluateHook | None = None, fraction_evaluate: float = 0.0,
                 **fedavg: Any) -> None:
        if clients_per_round is not None and clients_per_round < 1:
            raise ValueError(f"clients_per_round={clients_per_round!r} must be >= 1 (or None "
                             "to derive k from fraction_train)")
        self.valuation = (valuation or ValuationSettings()).check_utility(utility_factory)
        self.guards = guards or Guards()
        self.defences = build(defences, fedowen=True)
        params = selection_params or SelectionParams()
        self.choices = resolve_auto(self.valuation.method, registry.requested(selection),
                                    self.valuation.aggregation, self.guards.norm_cap, params.cap)
        if self.choices.norm_cap == "server" and server_step is None:
            raise ValueError("norm_cap='server' needs server_step (one server training step on "
                             "the evaluation set); or use norm_cap='median'")
        if self.guards.update_filter == "server-direction" and server_step is None:
            raise ValueError("update_filter='server-direction' needs server_step (one server "
                             "training step on the evaluation set)")
        if clients_per_round:  # wait for k nodes
            fedavg["min_available_nodes"] = clients_per_round
        super().__init__(fraction_evaluate=fraction_evaluate, **fedavg)
        self.clients_per_round, self.utility_factory = clients_per_round, utility_factory
        self.selection, self.norm_cap = self.choices.selection, self.choices.norm_cap
        self.selection_params = params
        self.node_wait_timeout, self.query_timeout = node_wait_timeout, query_timeout
        self.server_step, self.on_round, self.on_evaluate = server_step, on_round, on_evaluate
        sel_seq, val_seq = np.random.SeedSequence(seed).spawn(2)
        self.chooser = registry.selection(
            self.selection, None if isinstance(selection, str) else selection, params,
            self.choices.cap, np.random.default_rng(sel_seq))
        self.value_rng = np.random.default_rng(val_seq)
        self.roster = Roster()
        self.linked: set[str] = set()  # client ids caught returning copies of another's update
        self.round_offset = 0
        self._global: ArrayRecord | None = None
        self._connected: list[int] = []
        self._selected: list[str] = []
        self._selected_nodes: list[int] = []
        self._choice: dict[str, Any] | None = None  # what the round record keeps of it

    @property
    def defence(self) -> Defence:
        """The guards in force and the resolved norm cap, those whose steps the defence list
        leaves out off (the adaptive attacker reads them)."""
        return in_force(self.guards, self.norm_cap, self.defences)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint (the global model is saved beside it)."""
        return {"selection": self.chooser.state(),
                "client_of_node": {str(k): v for k, v in self.client_of_node.items()},
                "linked": sorted(self.linked, key=nodes.client_order),
                "value_rng": self.value_rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's state. To continue after ``r`` completed rounds also set
        ``round_offset = r``: the next ``start``'s round 1 is then round ``r + 1``."""
        self.chooser.load(state.get("selection", state))  # older checkpoints: one flat book
        self.roster.book = IdentityBook({int(k): str(v)
                                         for k, v in state["client_of_node"].items()})
        self.linked = {str(c) for c in state.get("linked", [])}  # older checkpoints: none
        self.value_rng.bit_generator.state = state["value_rng"]

    @property
    def client_of_node(self) -> dict[int, str]:
        """Node id -> the client id bound to it."""
        return self.roster.book.client_of_node

    def summary(self) -> None:
        """Log the settings."""
        k = self.clients_per_round or f"fraction_train={self.fraction_train:g}"
        log.info("FedOwen: k=%s, selection=%s, fraction_evaluate=%g", k, self.selection,
                 self.fraction_evaluate)
        for settings in (self.valuation, self.chooser.settings, self.selection_params,
                         self.guards):
            log.info("FedOwen: %s", settings)
        log.info("FedOwen: defences, in order: %s",
                 "; ".join(d.summary(self.guards) for d in self.defences))

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """Flower's round loop, the selector's run-length keys first resolved to the run's
        rounds in all (``round_offset + num_rounds``: a resumed run's total, as the app's)."""
        self.chooser.for_run(self.round_offset + num_rounds)
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                             evaluate_config, evaluate_fn)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Select clients with the run's selector; send them the global model as the
        dispatch steps leave it (the indicator's planting), the updates' reference."""
        server_round += self.round_offset
        self._global = arrays
        what = (f"clients-per-round={self.clients_per_round}" if self.clients_per_round
                else "min_available_nodes")
        found = nodes.wait_for_nodes(grid, self.min_available_nodes, self.node_wait_timeout,
                                     what=what)
        query = RecordDict({self.configrecord_key: ConfigRecord({"identify": 1})})
        self.roster.identify(lambda targets: grid.send_and_receive(self._construct_messages(
            query, targets, MessageType.QUERY), timeout=self.query_timeout), found)
        self._connected = found
        selectable, keys = self.roster.selectable(found, self.linked, server_round)
        if not selectable:
            self._selected, self._selected_nodes, self._choice = [], [], None
            return []
        arrays = self._global = dispatch_model(self.defences, arrays,
                                               Dispatching(server_round, self.guards))
        choice = self.chooser.choose(keys, server_round, round_size(
            len(keys), self.clients_per_round, self.fraction_train, self.min_train_nodes),
            self._asker(grid, arrays, selectable))
        self._selected = [keys[i] for i in choice.indices]
        self._selected_nodes = [selectable[i] for i in choice.indices]
        self._choice = choice.record
        log.info("configure_train: round %d, %s %d of %d clients: %s", server_round,
                 choice.how, len(choice.indices), len(selectable),
                 ", ".join(replies.short_label(c) for c in self._selected))
        config["server-round"] = server_round
        for name, value in self.chooser.train_config().items():  # what the selector asks
            config[name] = value
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, self._selected_nodes, MessageType.TRAIN)

    def _asker(self, grid: Grid, arrays: ArrayRecord, nodes_: list[int]) -> AskClients:
        """The selector's way to clients: a ``query`` message to each of ``indices`` (into
        ``nodes_``) with ``config`` (and the global model), their reply contents back."""
        def ask(indices: Sequence[int], config: Mapping[str, ConfigValue],
                with_model: bool = True) -> list[RecordDict | None]:
            targets = [nodes_[i] for i in indices]
            model = {self.arrayrecord_key: arrays} if with_model else {}
            query = RecordDict({**model, self.configrecord_key: ConfigRecord(dict(config))})
            answers = grid.send_and_receive(self._construct_messages(
                query, targets, MessageType.QUERY), timeout=self.query_timeout)
            return replies.contents_of(answers, targets)

        return ask

    def aggregate_train(self, server_round: int, answers: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check and guard the replies, value the updates, aggregate with softmax(phi / T)."""
        server_round += self.round_offset
        if self._global is None:
            raise RuntimeError("aggregate_train called before configure_train")
        global_state, answers = replies.record_to_state(self._global), list(answers)
        parse = partial(replies.parse_replies, reference=global_state,
                        arrays_key=self.arrayrecord_key, weight_key=self.weighted_by_key,
                        known=self.roster.book.client_of_node)  # norm-ratio: a screen step
        refuse = partial(refuse_replies, self.defences,
                         gate=Gate(self.roster, tuple(self._connected)))
        parsed, contents = self.roster.intake(answers, self._selected_nodes, self._connected,
                                              parse, refuse)
        step = self.server_step
        extra: dict[str, Any] = {} if self._choice is None else {"selection": self._choice}
        if ray := replies.ray_nodes(answers):
            extra["ray_nodes"] = ray
        out = aggregate_round(
            parsed, global_state, selected=self._selected, valuation=self.valuation,
            guards=self.guards, norm_cap=self.norm_cap, utility_factory=self.utility_factory,
            rng=self.value_rng, server_round=server_round,
            extra=extra,
            # one server step a round, however many defences read it (filter and norm cap)
            server_update=(None if step is None
                           else cache(partial(step, global_state, server_round))),
            reweight=self.chooser.weigh, step=self.chooser.step_weights(),
            defences=self.defences)
        self.linked.update(c for g in out.copies for c in g)
        updates = out.parsed.updates
        self.chooser.observe(Seen(
            server_round, tuple(u.client_id for u in updates),
            None if out.valuation is None else out.valuation.phi,
            tuple(contents[u.node_id] for u in updates), tuple(u.state for u in updates),
            global_state, out.record), out.links)
        if isinstance(out.record.get("selection"), dict):  # the selector's cost, now complete
            out.record["selection"] = {**out.record["selection"], **self.chooser.costs()}
        clients: dict[str, Any] = {}
        if out.valuation is not None:
            clients = dict(round_record.client_metrics(
                self.train_metrics_aggr_fn, self.weighted_by_key,
                [contents[u.node_id] for u in out.parsed.updates]))
        if self.on_round is not None:
            self.on_round(server_round, out.record, out.rows)
        metrics = MetricRecord(round_record.round_metrics(clients, out.parsed, out.valuation))
        return None if out.state is None else replies.state_to_record(out.state), metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """FedAvg's aggregation of the clients' evaluation metrics (handed to ``on_evaluate``);
        replies it cannot combine cost them only."""
        try:
            metrics = super().aggregate_evaluate(server_round, replies)
        except (TypeError, ValueError, KeyError, InconsistentMessageReplies) as err:
            log.warning("round %d: client evaluation metrics not aggregated: %s",
                        server_round, err)
            return None
        if metrics and self.on_evaluate is not None:
            self.on_evaluate(server_round + self.round_offset, dict(metrics))
        return metrics
