"""Flower's ``FedAvg`` keyword arguments, for strategies that take them through ``**fedavg``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

from flwr.serverapp.strategy import FedAvg

Init = TypeVar("Init", bound=Callable[..., None])


def takes_fedavg_arguments(init: Init) -> Init:
    """Decorate a strategy's ``__init__(self, ..., **fedavg)`` so that its signature lists Flower's
    ``FedAvg`` keyword arguments in place of ``**fedavg``: the strategy factory
    (:func:`server_app.strategies.strategy_kwargs`) passes a class only what its signature
    takes, and a reader sees every argument."""
    own = [p for p in inspect.signature(init).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in own}
    flower = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
              for name, p in inspect.signature(FedAvg.__init__).parameters.items()
              if name != "self" and name not in names]  # the strategy's own default wins
    setattr(init, "__signature__", inspect.Signature([*own, *flower]))  # noqa: B010
    return init
