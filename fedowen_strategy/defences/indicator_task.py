"""BackdoorIndicator's task on torch: :class:`TorchIndicator` plants the indicator samples into a
model state and scores a state on them, per assigned label
(:class:`fedowen_strategy.defences.indicator.IndicatorTask`).

The planting follows the public code's ``_global_watermark_injection``
(ybdai7/Backdoor-indicator-defense, ``participants/servers/IndicatorServer.py``): SGD with
momentum 0.9 and weight decay 5e-4 at ``indicator-lr``, the learning rate x 0.8 after epochs
10, 20, 30, 160, 200, 240, 280, 320 and 360 (its ``global_milestones``, ``global_lr_gamma``),
``indicator-epochs`` passes over the samples in fixed batches (its loader is materialised
once, so every epoch sees the same batches in the same order), each step's loss the
cross-entropy plus ``indicator-mu / 2`` x the L2 distance (not squared) of the parameters from
those the planting started from; the model in training mode, so its normalisation statistics
move with it. Seeded by (seed, round): dropout, if the model has any, draws from a forked
torch generator, and the global one is left as it was.

Imported only where a task is built (the ServerApp, tests): the defence table does not import
torch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from fedowen_strategy.defences.guard_settings import Guards

#: The public code's ``global_milestones`` and ``global_lr_gamma``.
MILESTONES = (10, 20, 30, 160, 200, 240, 280, 320, 360)
GAMMA = 0.8
#: The public code's ``global_momentum`` and ``global_weight_decay``.
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
#: The public code's ``ood_data_batch_size``.
BATCH_SIZE = 64


class TorchIndicator:
    """The indicator samples ``x`` (shaped as the model's input) with their assigned labels
    ``y``, planted into and scored on copies of ``model``.

    Parameters
    ----------
    model : torch.nn.Module
        The run's architecture (copied; its weights are replaced by each state).
    x, y : torch.Tensor
        The samples and their labels (int64, each a class of the model's output).
    seed : int
        Seeds the planting with the round.
    batch_size : int
        The planting's batch (the public code's 64); the scoring's too.
    device : torch.device or str, optional
        Where it trains and scores (default: the CPU).
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, seed: int = 0,
                 batch_size: int = BATCH_SIZE, device: torch.device | str | None = None
                 ) -> None:
        if len(x) != len(y) or len(y) == 0:
            raise ValueError(f"the indicator needs samples with one label each: got {len(x)} "
                             f"samples and {len(y)} labels")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1 (the public code's 64)")
        self.device = torch.device(device or "cpu")
        self.model = copy.deepcopy(model).to(self.device)
        self.x = x.to(self.device)
        self.y = y.to(device=self.device, dtype=torch.long)
        self.seed, self.batch_size = seed, batch_size
        self.labels = sorted(int(v) for v in torch.unique(self.y).tolist())

    def _load(self, state: Mapping[str, NDArray]) -> nn.Module:
        self.model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()})
        return self.model

    def _state(self) -> dict[str, NDArray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}

    def plant(self, state: Mapping[str, NDArray], server_round: int, guards: Guards
              ) -> dict[str, NDArray]:
        """``state`` trained on the samples (module docstring), every entry returned."""
        net = self._load(state)
        net.train()
        start = [p.detach().clone() for p in net.parameters()]
        optimizer = torch.optim.SGD(net.parameters(), lr=guards.indicator_lr, momentum=MOMENTUM,
                                    weight_decay=WEIGHT_DECAY)
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(MILESTONES), GAMMA)
        seed = int(np.random.SeedSequence([self.seed, server_round, 0x1D1C]).generate_state(1)[0])
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            for _ in range(guards.indicator_epochs):
                for xb, yb in zip(self.x.split(self.batch_size), self.y.split(self.batch_size),
                                  strict=True):
                    optimizer.zero_grad()
                    pull = torch.linalg.vector_norm(torch.cat(
                        [(p - p0).reshape(-1) for p, p0 in zip(net.parameters(), start,
                                                                strict=True)]))
                    loss = nn.functional.cross_entropy(net(xb), yb) + guards.indicator_mu / 2 * pull
                    loss.backward()
                    optimizer.step()
                schedule.step()
        return self._state()

    @torch.no_grad()
    def label_accuracy(self, state: Mapping[str, NDArray]) -> dict[int, float]:
        """Per assigned label, the share of its samples classified as it (evaluation mode)."""
        net = self._load(state)
        net.eval()
        predicted = torch.cat([net(xb).argmax(dim=1) for xb in self.x.split(self.batch_size)])
        hit = predicted == self.y
        return {label: float(hit[self.y == label].float().mean()) for label in self.labels}
