"""From the run config to the strategy the ServerApp runs, behind one protocol.

One table, :data:`KINDS`: ``fedowen`` builds :class:`fedowen_strategy.FedOwen` with a
coalition utility on the server's evaluation set (and, for ``norm-cap = "server"``, the
server step); every other name (:data:`server_app.strategies.NAMES` or ``module:Class``)
builds Flower's class or a peer (:func:`server_app.strategies.build_flower_strategy`) with
the constructor arguments the run config cannot hold (:mod:`server_app.peers`). Each is a
:class:`server_app.strategies.ServerStrategy`, so the ServerApp never asks which it has.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedowen_strategy.defences.base import Guard
from fedowen_strategy.defences.indicator import Indicator
from fedowen_strategy.defences.table import resolve
from fedowen_strategy.round.contribution import UtilityFactory
from fedowen_strategy.strategy import EvaluateHook, FedOwen, ServerStep
from fedowen_strategy.torch_utility import CoalitionUtility
from server_app.config import RunConfig
from server_app.evaluation import ServerParts
from server_app.indicator import indicator_guard
from server_app.peers import PerRound, peer_arguments, root_trainer
from server_app.store.records import RunRecorder
from server_app.strategies import ServerStrategy, build_flower_strategy


def client_evaluation(recorder: RunRecorder) -> EvaluateHook:
    """Federated evaluation's aggregated metrics into the round's record (``client_eval``)."""
    return lambda server_round, metrics: recorder.log_train(
        server_round, {"client_eval": metrics}, [])


def build_strategy(cfg: RunConfig, factory: UtilityFactory | None,
                   recorder: RunRecorder | None, server_step: ServerStep | None = None,
                   defences: str | Sequence[str | Guard] | None = None) -> FedOwen:
    """The FedOwen strategy the run config describes (federated evaluation off by default:
    the ServerApp evaluates centrally); ``server_step`` serves ``norm-cap = "server"``;
    ``defences`` (default: the run config's) may hold bound guards (the indicator's)."""
    arguments = cfg.fedowen_arguments()
    if defences is not None:
        arguments["defences"] = defences
    return FedOwen(**arguments, utility_factory=factory, server_step=server_step,
                   on_round=recorder.log_train if recorder else None,
                   on_evaluate=client_evaluation(recorder) if recorder else None)


def valuation_workers(workers: int) -> int:
    """``valuation-workers`` resolved: 0 is one per core this process may use."""
    return workers or len(os.sched_getaffinity(0))


def bound_defences(cfg: RunConfig, parts: ServerParts, fedowen: bool
                   ) -> str | list[str | Guard]:
    """The run's ``defences`` with ``indicator`` bound to its task, the run's model and its
    OOD samples (:func:`server_app.indicator.indicator_guard`); a list without it as the run
    config has it."""
    names = resolve(cfg.defences, fedowen)
    if Indicator.name not in names:
        return cfg.defences
    guard = indicator_guard(parts.model, parts.sets.x_test, parts.device, dataset=cfg.dataset,
                            ood=cfg.indicator_ood, samples=cfg.indicator_samples, seed=cfg.seed,
                            data_dir=cfg.data_dir, download=cfg.download)
    return [guard if name == Indicator.name else name for name in names]


def _fedowen(cfg: RunConfig, num_nodes: int, parts: ServerParts) -> ServerStrategy:
    """FedOwen with a coalition utility on the evaluation set."""
    factory = CoalitionUtility(parts.model, parts.sets.x_eval, parts.sets.y_eval,
                               metric=cfg.utility_metric, device=parts.device,
                               workers=valuation_workers(cfg.valuation_workers))
    # norm-cap = "server" and update-filter = "server-direction": one epoch on the evaluation
    # set a round, as FLTrust's server update
    step = (PerRound(root_trainer(cfg, parts.model, parts.sets, parts.device, 0, 1))
            if cfg.choices().norm_cap == "server" or cfg.update_filter == "server-direction"
            else None)
    return build_strategy(cfg, factory, parts.recorder, step,
                          bound_defences(cfg, parts, fedowen=True))


def _flower(cfg: RunConfig, num_nodes: int, parts: ServerParts) -> ServerStrategy:
    """Flower's strategy or a peer, recorded as FedOwen is."""
    random.seed(cfg.seed)  # Flower's strategies sample nodes with the global random
    return build_flower_strategy(cfg, num_nodes, parts.recorder.log_train,
                                 client_evaluation(parts.recorder),
                                 defences=bound_defences(cfg, parts, fedowen=False),
                                 **peer_arguments(cfg, parts.model, parts.sets, parts.device))


@dataclass(frozen=True)
class Kind:
    """How one kind of strategy is built and what a run of it is called in its log."""

    build: Callable[[RunConfig, int, ServerParts], ServerStrategy]
    label: Callable[[RunConfig], str]


#: Strategy name -> its kind; any other name is :data:`FLOWER`.
KINDS = {"fedowen": Kind(_fedowen, lambda cfg: f"FedOwen (valuation={cfg.valuation})")}
FLOWER = Kind(_flower, lambda cfg: f"strategy={cfg.strategy}")


def make_strategy(cfg: RunConfig, num_nodes: int, parts: ServerParts) -> ServerStrategy:
    """The strategy ``cfg.strategy`` names, for ``num_nodes`` connected nodes."""
    return KINDS.get(cfg.strategy, FLOWER).build(cfg, num_nodes, parts)


def strategy_label(cfg: RunConfig) -> str:
    """What a run is called in its log: ``FedOwen (valuation=owen)`` or the strategy's name."""
    return KINDS.get(cfg.strategy, FLOWER).label(cfg)
