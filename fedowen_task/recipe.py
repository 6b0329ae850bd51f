"""The local-training recipe's settings (:class:`TrainConfig`), without torch.

:class:`~fedowen_task.config.TaskConfig` takes its training keys (``lr``, ``momentum``,
``batch-size``, ``local-epochs``, ``weight-decay``) and their defaults from here, and maps
onto a :class:`TrainConfig` in one method (``TaskConfig.train_config``), which the ClientApp
and the ServerApp's root-set training (FLTrust, ``norm-cap = "server"``) both call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Protocol

from fedowen_task.declare import key


class Recipe(Protocol):
    """Anything that holds the recipe's fields (:class:`TrainConfig`, ``TaskConfig``)."""

    @property
    def lr(self) -> float: ...
    @property
    def momentum(self) -> float: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def local_epochs(self) -> int: ...
    @property
    def weight_decay(self) -> float: ...


def recipe_problems(recipe: Recipe, keys: Mapping[str, str] = MappingProxyType({})
                    ) -> list[str]:
    """What is wrong with the recipe's fields, each named as ``keys`` says (default: the
    field's own name)."""
    def k(field: str) -> str:
        return keys.get(field, field)

    checks = [
        (recipe.lr > 0, f"{k('lr')}={recipe.lr!r} must be > 0"),
        (0 <= recipe.momentum < 1, f"{k('momentum')}={recipe.momentum!r} must lie in [0, 1)"),
        (isinstance(recipe.batch_size, int) and recipe.batch_size >= 1,
         f"{k('batch_size')}={recipe.batch_size!r} must be an int >= 1"),
        (isinstance(recipe.local_epochs, int) and recipe.local_epochs >= 1,
         f"{k('local_epochs')}={recipe.local_epochs!r} must be an int >= 1"),
        (recipe.weight_decay >= 0, f"{k('weight_decay')}={recipe.weight_decay!r} must be >= 0"),
    ]
    return [message for ok, message in checks if not ok]


@dataclass(frozen=True)
class TrainConfig:
    """Local-training hyperparameters, validated (:func:`recipe_problems`).

    The defaults (``lr=0.05, momentum=0.5, batch_size=10, local_epochs=1``, no weight decay):
    the recipe the confirmation's tuning picked by equal-weight FedAvg's validation accuracy
    on MNIST, FashionMNIST and CIFAR-10 (within 0.7 points of FEMNIST's pick; README, "Run
    configuration"); one local epoch is the paper's setting (Sec. 4.1).
    """

    lr: float = key(0.05, "local SGD's learning rate")
    momentum: float = key(0.5, "local SGD's momentum")
    batch_size: int = key(10, "local batch size")
    local_epochs: int = key(1, "local epochs a round")
    weight_decay: float = key(0.0, "local SGD's weight decay")

    def __post_init__(self) -> None:
        if problems := recipe_problems(self):
            raise ValueError("Invalid TrainConfig: " + "; ".join(problems))

    def train_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`fedowen_task.training.train` (``local_epochs``
        becomes ``epochs``)."""
        kwargs = asdict(self)
        kwargs["epochs"] = kwargs.pop("local_epochs")
        return kwargs
