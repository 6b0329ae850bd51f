"""Strategy swap by config: FedOwen or Flower's own strategies, with the same records.

``strategy = fedowen | fedavg | fedavgm | fedprox | krum | multikrum | fedadam | fedyogi |
fedtrimmedavg | fedmedian | fltrust | foolsgold | module:Class``. ``fltrust`` and
``foolsgold`` are this project's peers (:mod:`fedowen_strategy.peers.fltrust`,
:mod:`fedowen_strategy.peers.foolsgold`), thin subclasses of Flower's FedAvg built the same way;
FLTrust's server update (training on the root set) comes from the ServerApp
(:mod:`server_app.peers`). A Flower strategy is Flower's class itself, constructed from the
run config (k = ``clients-per-round`` via ``fraction_train = k / connected nodes`` and
``min_train_nodes = k``; FedProx's ``proximal-mu``; Krum's ``krum-malicious``; FoolsGold's
``foolsgold-kappa``; FLTrust's ``fltrust-server-lr``; anything else through
``strategy-params = "name=value ..."``, checked against the class's constructor), wrapped
by :class:`Recorded` so every round lands in ``rounds.jsonl`` (selected, returned, failed and
rejected clients: a reply of another model is rejected before the strategy sees it,
:mod:`server_app.matched`; ``aggregation_seconds``; the peers add the per-client ``weights``
they applied) like FedOwen's. Federated evaluation follows ``fraction-evaluate`` (off by
default; its aggregated metrics land in the round's record as ``client_eval``); the ServerApp
evaluates the global model centrally after each round either way. The run's defence list
(``defences``; ``auto``: the statistics cap and rule, :data:`~fedowen_strategy.defences.table.
FLOWER_DEFENCES`) runs around every one of them: the class is wrapped by
:class:`~fedowen_strategy.defences.defended.Defended`, the shape of Flower's own DP wrappers.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp import strategy as flwr_strategies
from flwr.serverapp.strategy import Result, Strategy

from fedowen_strategy.defences.base import Guard
from fedowen_strategy.defences.defended import Defended
from fedowen_strategy.defences.guard_settings import Defence
from fedowen_strategy.replies import client_id_of, failure_reason, record_to_state, state_to_record
from fedowen_strategy.strategy import EvaluateHook, RoundHook, ServerStep
from fedowen_strategy.updates import restore_counters
from fedowen_task.config import did_you_mean, parse_params
from server_app.matched import Matched

FLOWER = {"fedavg": "FedAvg", "fedavgm": "FedAvgM", "fedprox": "FedProx", "krum": "Krum",
          "multikrum": "MultiKrum", "fedadam": "FedAdam", "fedyogi": "FedYogi",
          "fedtrimmedavg": "FedTrimmedAvg", "fedmedian": "FedMedian"}
#: This project's peer defences: name -> (module, class).
PEERS = {"fltrust": ("fedowen_strategy.peers.fltrust", "FLTrust"),
         "foolsgold": ("fedowen_strategy.peers.foolsgold", "FoolsGold")}
NAMES = ("fedowen", *FLOWER, *PEERS)
#: Strategies whose only state between rounds is the global model (resume-from works;
#: FedAvgM's server momentum, FoolsGold's history and module:Class are not checkpointed).
RESUMABLE = ("fedowen", "fedavg", "fedprox", "krum", "multikrum", "fedtrimmedavg", "fedmedian",
             "fltrust")
# Keys the ServerApp sets from the run config; strategy-params may not repeat them.
_OWNED = ("fraction_train", "fraction_evaluate", "min_train_nodes", "min_evaluate_nodes",
          "min_available_nodes", "proximal_mu", "num_malicious_nodes", "kappa",
          "server_update", "server_lr")


class ServerStrategy(Protocol):
    """What the ServerApp needs of a strategy besides Flower's ``start``: the state to
    checkpoint and restore, the rounds a resume skips, and the server step it uses.

    :class:`fedowen_strategy.FedOwen` has these of its own; Flower's strategies and the peers
    get them from :class:`Recorded`.
    """

    #: Rounds completed before this ``start`` (a resume): its round r is round r + offset.
    round_offset: int

    @property
    def server_step(self) -> ServerStep | None:
        """``(global_state, round) -> state``: the server's own training step the strategy
        uses (FedOwen's ``norm-cap = "server"``), which the adaptive attacker also reads;
        None without one."""

    @property
    def defence(self) -> Defence | None:
        """FedOwen's guards in force and its resolved norm cap, which the adaptive attacker
        reads (:mod:`server_app.byzantine`); None for a strategy without them."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint (the global model is saved beside it)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state."""

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """Flower's round loop."""


def strategy_class(name: str) -> type[Strategy]:
    """The class ``strategy = name`` names (a Flower strategy or ``module:Class``)."""
    if name in FLOWER:
        return getattr(flwr_strategies, FLOWER[name])
    if name in PEERS:
        module_name, class_name = PEERS[name]
        return getattr(importlib.import_module(module_name), class_name)
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"strategy={name!r} is not one of {', '.join(NAMES)}"
                         f"{did_you_mean(name, NAMES)} or module:Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"strategy={name!r}: cannot import {attr} from {module} ({err})") from err
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ValueError(f"strategy={name!r} is not a flwr.serverapp.strategy.Strategy subclass")
    return cls


def strategy_kwargs(cfg: Any, cls: type[Strategy], num_nodes: int) -> dict[str, Any]:
    """Constructor arguments from the run config, for ``num_nodes`` connected nodes."""
    k = cfg.clients_per_round
    kwargs: dict[str, Any] = {
        "fraction_train": min(1.0, k / max(num_nodes, 1)),
        "fraction_evaluate": cfg.fraction_evaluate,
        "min_train_nodes": k, "min_evaluate_nodes": 0, "min_available_nodes": k,
        "proximal_mu": cfg.proximal_mu, "num_malicious_nodes": cfg.krum_malicious,
        "num_nodes_to_select": max(1, k - cfg.krum_malicious),
        "kappa": cfg.foolsgold_kappa, "server_lr": cfg.fltrust_server_lr,
    }
    kwargs.update(parse_params(cfg.strategy_params, "strategy-params"))
    signature = inspect.signature(cls)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return kwargs
    return {key: v for key, v in kwargs.items() if key in signature.parameters}


def strategy_problems(cfg: Any) -> list[str]:
    """What is wrong with ``strategy``, ``strategy-params``, ``proximal-mu`` and resuming."""
    if cfg.strategy == "fedowen":
        bad = []
        if cfg.strategy_params:
            bad.append(f"strategy-params={cfg.strategy_params!r} applies to Flower's strategies; "
                       "FedOwen takes its own keys (valuation, selection, ...)")
        if cfg.proximal_mu > 0:  # < 0: RunConfig's range says so
            bad.append(f"proximal-mu={cfg.proximal_mu} is FedProx's: set strategy='fedprox'")
        return bad
    try:
        cls = strategy_class(cfg.strategy)
        params = parse_params(cfg.strategy_params, "strategy-params")
    except ValueError as err:
        return [str(err)]
    bad = [f"strategy-params: {name} is set by the run config; use its own key"
           for name in params if name in _OWNED]
    signature = inspect.signature(cls)
    known = [p for p in signature.parameters if p != "self"]
    for name, value in params.items():
        spec = signature.parameters.get(name)
        if spec is None:
            bad.append(f"strategy-params: {cls.__name__} has no parameter {name!r}"
                       f"{did_you_mean(name, known)}; it takes {', '.join(known)}")
        elif isinstance(spec.default, float) and not isinstance(value, int | float):
            bad.append(f"strategy-params: {name}={value!r} should be a number")
    if cfg.proximal_mu > 0 and "proximal_mu" not in signature.parameters:
        bad.append(f"proximal-mu={cfg.proximal_mu} is FedProx's; {cfg.strategy} ignores it")
    if cfg.resume_from and cfg.strategy not in RESUMABLE:
        bad.append(f"resume-from: strategy={cfg.strategy!r} keeps server state this app does "
                   f"not checkpoint; resume works with {', '.join(RESUMABLE)}")
    return bad


class Recorded(Strategy):
    """Mixin for a wrapped Flower strategy: records every round as FedOwen does, numbers
    rounds globally after a resume and implements :class:`ServerStrategy`. Use
    :func:`build_flower_strategy`, which puts it first in the bases of a subclass of
    :class:`~fedowen_strategy.defences.defended.Defended` around the Flower class."""

    on_round: RoundHook | None = None
    on_evaluate: EvaluateHook | None = None
    round_offset: int = 0
    #: None: no FedOwen server step (FLTrust's root-set training is its own ``server_update``).
    server_step: ServerStep | None = None
    defence: Defence | None = None
    strategy_name: str = ""

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the resumable ones (:data:`RESUMABLE`) keep no state between rounds but
        the global model, and the others may not resume (:func:`strategy_problems`)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (:meth:`state_dict`)."""

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        messages = list(super().configure_train(  # type: ignore[safe-super]
            server_round + self.round_offset, arrays, config, grid))
        self._selected_nodes = [m.metadata.dst_node_id for m in messages]
        self._sent_arrays = arrays  # the counters' dtype and shape (counters_kept)
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        metrics = super().aggregate_evaluate(server_round, replies)  # type: ignore[safe-super]
        if metrics and self.on_evaluate is not None:
            self.on_evaluate(server_round + self.round_offset, dict(metrics))
        return metrics

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies, started = list(replies), time.perf_counter()
        ok = [r for r in replies if not r.has_error()]
        names = {r.metadata.src_node_id: client_id_of(r) for r in ok}
        result = super().aggregate_train(  # type: ignore[safe-super]
            server_round + self.round_offset, replies)
        if result[0] is not None:  # Flower's average turns counters into floats
            result = (counters_kept(result[0], self._sent_arrays), result[1])
        answered = {r.metadata.src_node_id for r in replies}
        failed = {client_id_of(r): failure_reason(r.error.code, r.error.reason)
                  for r in replies if r.has_error()}
        failed.update({f"node:{n}": "no reply" for n in self._selected_nodes
                       if n not in answered})
        record = {"selected": [names.get(n, f"node:{n}") for n in self._selected_nodes],
                  "returned": [names[r.metadata.src_node_id] for r in ok], "failed": failed,
                  "rejected": {}, "strategy": self.strategy_name,
                  "aggregation_seconds": time.perf_counter() - started}
        # the defences (Defended) and a peer (UpdateWeighted): whom they accepted, the weights
        # applied, what each step did
        record.update(getattr(self, "round_record", {}))
        if self.on_round is not None:
            self.on_round(server_round + self.round_offset, record, [])
        return result


def counters_kept(aggregate: ArrayRecord, sent: ArrayRecord) -> ArrayRecord:
    """Flower's aggregate with its integer buffers back in the dtype and shape of the model
    ``sent`` (the buffer rule of :mod:`fedowen_strategy.updates`: the weighted average,
    rounded)."""
    return state_to_record(restore_counters(record_to_state(aggregate), record_to_state(sent)))


def build_flower_strategy(cfg: Any, num_nodes: int, on_round: RoundHook | None,
                          on_evaluate: EvaluateHook | None = None, *,
                          defences: str | Sequence[str | Guard] | None = None,
                          **extra: Any) -> Recorded:
    """Flower's strategy (or a peer) ``cfg.strategy``, recording rounds through ``on_round``;
    ``defences`` the list around it (default: the run config's; it may hold bound guards, the
    indicator's); ``extra`` are constructor arguments the run config cannot hold (FLTrust's
    ``server_update``)."""
    cls = strategy_class(cfg.strategy)
    inner = cls(**strategy_kwargs(cfg, cls, num_nodes), **extra)
    recorded = type(f"Recorded{cls.__name__}", (Recorded, Matched, Defended), {})
    strategy = recorded(inner, cfg.defences if defences is None else defences, cfg.guards(),
                        seed=cfg.seed)
    strategy.on_round = on_round  # a resume sets ``round_offset`` (server_app.app.resume)
    strategy.on_evaluate = on_evaluate
    strategy.strategy_name = cfg.strategy
    return strategy
