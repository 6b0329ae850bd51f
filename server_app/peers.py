"""The ServerApp's side of the peer defences: FLTrust's root set and its server update.

FLTrust's root set is the server evaluation set FedOwen values coalitions on
(``eval-fraction`` of the training split, stratified, never given to clients), or a seeded
subset of ``fltrust-root-size`` of its examples (the paper used 100). So both defences use
the same server data, but not in the same way: FedOwen only *evaluates* models on it,
FLTrust *trains* on it every round (``fltrust-root-epochs`` epochs with the clients'
``lr``, ``momentum``, ``batch-size``, ``weight-decay``). Its direction is that of balanced,
clean data, which helps it against attackers and can also distrust honest clients whose
skewed (non-IID) data points elsewhere; and its cost, one local training step per round on
the server, is in each round's ``aggregation_seconds``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from fedowen_task.recipe import TrainConfig
from fedowen_task.training import train
from server_app.config import RunConfig


def root_set(x: torch.Tensor, y: torch.Tensor, size: int, seed: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` itself (``size = 0``) or a seeded subset of ``size`` of its examples."""
    if size < 0 or size > len(y):
        raise ValueError(f"fltrust-root-size={size} must lie in [0, {len(y)}] (the server "
                         "evaluation set's size; 0 = all of it): lower it or raise "
                         "eval-fraction")
    if size in (0, len(y)):
        return x, y
    keep = np.sort(np.random.default_rng([seed, 0xF17]).choice(len(y), size, replace=False))
    idx = torch.as_tensor(keep)
    return x[idx], y[idx]


class RootTrainer:
    """FLTrust's ``server_update``: the global model trained on the root set, seeded by
    (seed, round), so a resumed run repeats it."""

    def __init__(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                 settings: TrainConfig, seed: int, device: torch.device) -> None:
        self.model = copy.deepcopy(model)
        self.x, self.y, self.settings = x, y, settings
        self.seed, self.device = seed, device

    def __call__(self, global_state: Mapping[str, NDArray], server_round: int
                 ) -> dict[str, NDArray]:
        self.model.load_state_dict({k: torch.as_tensor(np.asarray(v))
                                    for k, v in global_state.items()})
        seed = int(np.random.SeedSequence([self.seed, server_round, 0xF17]).generate_state(1)[0])
        train(self.model, self.x, self.y, seed=seed, device=self.device,
              **self.settings.train_kwargs())
        return {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}


class PerRound:
    """A server step computed once per round: FedOwen's ``norm-cap = "server"`` and the
    adaptive attacker (:mod:`server_app.byzantine`) ask for the same round's step."""

    def __init__(self, step: RootTrainer) -> None:
        self.step = step
        self._last: tuple[int, dict[str, NDArray]] | None = None

    def __call__(self, global_state: Mapping[str, NDArray], server_round: int
                 ) -> dict[str, NDArray]:
        if self._last is None or self._last[0] != server_round:
            self._last = (server_round, self.step(global_state, server_round))
        return self._last[1]


def root_trainer(cfg: RunConfig, model: torch.nn.Module, sets: tuple[torch.Tensor, ...],
                 device: torch.device, size: int, epochs: int) -> RootTrainer:
    """The global model trained for ``epochs`` on ``size`` examples of the evaluation set
    (0: all of it) with the clients' optimiser settings."""
    x, y = root_set(sets[0], sets[1], size, cfg.seed)
    settings = replace(cfg.train_config(), local_epochs=epochs)
    return RootTrainer(model, x, y, settings, cfg.seed, device)


def fltrust_arguments(cfg: RunConfig, model: torch.nn.Module, sets: tuple[torch.Tensor, ...],
                      device: torch.device) -> dict[str, Any]:
    """FLTrust's ``server_update``: the root-set trainer."""
    return {"server_update": root_trainer(cfg, model, sets, device, cfg.fltrust_root_size,
                                          cfg.fltrust_root_epochs)}


#: Strategy name -> the constructor arguments the run config cannot hold.
PEER_ARGUMENTS: dict[str, Callable[[RunConfig, torch.nn.Module, tuple[torch.Tensor, ...],
                                    torch.device], dict[str, Any]]] = {
    "fltrust": fltrust_arguments}


def peer_arguments(cfg: RunConfig, model: torch.nn.Module, sets: tuple[torch.Tensor, ...],
                   device: torch.device) -> dict[str, Any]:
    """Constructor arguments of ``cfg.strategy`` that the run config cannot hold (none for
    most strategies)."""
    arguments = PEER_ARGUMENTS.get(cfg.strategy)
    return arguments(cfg, model, sets, device) if arguments else {}
