"""A ready coalition utility for torch models (optional: the only part of the library that
needs torch, imported only when used).

    from fedowen_strategy import FedOwen
    from fedowen_strategy.torch_utility import CoalitionUtility

    strategy = FedOwen(utility_factory=CoalitionUtility(model, x_eval, y_eval), ...)

nu(S) is minus the cross-entropy (the app's ``utility-metric = "neg-loss"``; or the accuracy,
``metric="accuracy"``) on the server's evaluation tensors of the coalition's model: in the
delta game (the default) ``global + sum_{i in S} p_i delta_i``, in the average game the
num-examples-weighted average of the models in S; nu(empty) is the current global model's.
Every round the factory builds a :class:`~.batched.CoalitionGame`, which evaluates coalitions
in batches (see :mod:`fedowen_strategy.torch_utility.batched`).
What does not change between rounds is prepared once, on the first round: the network in
the form its forwards run through (:func:`~.forward.prepare_net`, a ``torch.fx`` trace on the
CPU) and the evaluation tensors on the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedowen_strategy.round.contribution import DEFAULT_UTILITY_METRIC
from fedowen_strategy.torch_utility.batched import (
    METRICS,
    CoalitionGame,
    gradient_net,
    resolve_device,
)
from fedowen_strategy.torch_utility.forward import prepare_net

__all__ = ["CoalitionGame", "CoalitionUtility"]


class CoalitionUtility:
    """A ``utility_factory`` for :class:`fedowen_strategy.FedOwen` from a torch model.

    Parameters
    ----------
    model : nn.Module
        The architecture (its weights are never used; each round's states are loaded into a
        copy). Its ``state_dict`` keys must be the keys of the ArrayRecords the clients send.
    x_eval, y_eval : torch.Tensor
        The server-held evaluation set (inputs as the model takes them, integer labels).
    metric : {"neg-loss", "accuracy"}
        What nu(S) measures (default: the app's, ``neg-loss``).
    device : str, torch.device or None
        ``None``: CUDA when available, else the CPU.
    **options
        Passed to :class:`CoalitionGame` (``batch_size``, ``chunk_size``, ``mode``,
        ``memory_cap_bytes``, ``forward``).
    """

    def __init__(self, model: nn.Module, x_eval: torch.Tensor, y_eval: torch.Tensor, *,
                 metric: str = DEFAULT_UTILITY_METRIC, device: str | torch.device | None = None,
                 **options: Any) -> None:
        if metric not in METRICS:
            raise ValueError(f"metric={metric!r} is not one of {METRICS}")
        if not isinstance(x_eval, torch.Tensor) or not isinstance(y_eval, torch.Tensor):
            raise ValueError("x_eval and y_eval must be torch tensors; wrap numpy arrays with "
                             "torch.as_tensor(...)")
        if len(x_eval) == 0 or len(x_eval) != len(y_eval):
            raise ValueError(f"x_eval and y_eval need equal non-zero lengths, got {len(x_eval)} "
                             f"and {len(y_eval)}")
        self.model, self.x_eval, self.y_eval = model, x_eval, y_eval
        self.metric, self.device, self.options = metric, device, options
        self._prepared: tuple[torch.nn.Module, torch.Tensor, torch.Tensor] | None = None
        self._grad_net: torch.nn.Module | None = None

    def _prepare(self) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
        """The network and the evaluation tensors on the device, built on the first call."""
        if self._prepared is None:
            device = resolve_device(self.device)
            net = prepare_net(self.model, device, self.options.get("forward", "auto"))
            dtype = next(v for v in self.model.state_dict().values() if v.is_floating_point())
            self._prepared = (net, self.x_eval.to(device, dtype.dtype),
                              self.y_eval.to(device, torch.long))
        return self._prepared

    def __call__(self, global_state: Mapping[str, np.ndarray],
                 client_states: Sequence[Mapping[str, np.ndarray]],
                 num_examples: Sequence[int],
                 shares: Sequence[float] | None = None) -> CoalitionGame:
        """This round's game: the utility of any coalition of ``client_states`` (``shares``:
        the delta game's weights, see :func:`fedowen_strategy.round.round_valuers.delta_shares`)."""
        net, x_eval, y_eval = self._prepare()
        return CoalitionGame(self.model, global_state, client_states, num_examples, x_eval,
                             y_eval, metric=self.metric, device=self.device,
                             shares=shares, net=net, grad_net=self._gradient_net(net),
                             **self.options)

    def _gradient_net(self, net: torch.nn.Module) -> torch.nn.Module:
        """The network of the first-order terms' backward passes, built once a run
        (:meth:`CoalitionGame.gradient_net`)."""
        if self._grad_net is None:
            self._grad_net = gradient_net(net, self.model, resolve_device(self.device))
        return self._grad_net
