"""The local-training recipe (:class:`TrainConfig`) and its run-config keys
(:class:`RecipeKeys`), without torch.

Each model carries its own recipe (``fedowen_task.models.model_recipe``: a built-in's, or a
user's factory's ``recipe`` attribute, else the base recipe ``TrainConfig()``). The keys
``lr``, ``momentum``, ``batch-size``, ``local-epochs`` and ``weight-decay`` override it field
by field; as Flower's run config always carries every key, "not set" is each key's default,
a value no recipe can hold (:data:`FROM_MODEL`: 0 for the three that must be positive, -1
for momentum and weight decay, where 0 is a recipe). ``TaskConfig.train_config`` resolves
the model (``auto``) and then its recipe under the keys, in that one place; the ClientApp,
the ServerApp's root-set training (FLTrust, ``norm-cap = "server"``) and the run's records
(``config.json``, ``summary.json``) all read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from types import MappingProxyType
from typing import Any, Protocol

from fedowen_task.declare import key

#: Each recipe key's "not set" value: the model's recipe decides the field.
FROM_MODEL: Mapping[str, float] = MappingProxyType(
    {"lr": 0.0, "momentum": -1.0, "batch_size": 0, "local_epochs": 0, "weight_decay": -1.0})


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
    return [message for _, ok, message in _checks(recipe, keys) if not ok]


def _checks(recipe: Recipe, keys: Mapping[str, str]) -> list[tuple[str, bool, str]]:
    """``(field, ok, problem)`` of each field's rule."""
    def k(field: str) -> str:
        return keys.get(field, field)

    return [
        ("lr", recipe.lr > 0, f"{k('lr')}={recipe.lr!r} must be > 0"),
        ("momentum", 0 <= recipe.momentum < 1,
         f"{k('momentum')}={recipe.momentum!r} must lie in [0, 1)"),
        ("batch_size", isinstance(recipe.batch_size, int) and recipe.batch_size >= 1,
         f"{k('batch_size')}={recipe.batch_size!r} must be an int >= 1"),
        ("local_epochs", isinstance(recipe.local_epochs, int) and recipe.local_epochs >= 1,
         f"{k('local_epochs')}={recipe.local_epochs!r} must be an int >= 1"),
        ("weight_decay", recipe.weight_decay >= 0,
         f"{k('weight_decay')}={recipe.weight_decay!r} must be >= 0"),
    ]


@dataclass(frozen=True)
class TrainConfig:
    """Local-training hyperparameters, validated (:func:`recipe_problems`).

    The defaults, the base recipe (``lr=0.05, momentum=0.5, batch_size=10, local_epochs=1``,
    no weight decay): LeNet's and the small CNN's, the recipe the confirmation's tuning picked
    by equal-weight FedAvg's validation accuracy on MNIST, FashionMNIST and CIFAR-10 (within
    0.7 points of FEMNIST's pick; README, "Run configuration"); one local epoch is the paper's
    setting (Sec. 4.1). ResNet-18's own (``fedowen_task.models``) differ.
    """

    lr: float = 0.05
    momentum: float = 0.5
    batch_size: int = 10
    local_epochs: int = 1
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if problems := recipe_problems(self):
            raise ValueError("Invalid TrainConfig: " + "; ".join(problems))

    def train_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`fedowen_task.training.train` (``local_epochs``
        becomes ``epochs``)."""
        kwargs = asdict(self)
        kwargs["epochs"] = kwargs.pop("local_epochs")
        return kwargs


@dataclass(frozen=True)
class RecipeKeys:
    """The recipe's run-config keys; each left at its default (:data:`FROM_MODEL`) takes the
    model's recipe (:meth:`over`)."""

    lr: float = key(0.0, "local SGD's learning rate (0: the model's recipe)")
    momentum: float = key(-1.0, "local SGD's momentum (-1: the model's recipe)")
    batch_size: int = key(0, "local batch size (0: the model's recipe)")
    local_epochs: int = key(0, "local epochs a round (0: the model's recipe)")
    weight_decay: float = key(-1.0, "local SGD's weight decay (-1: the model's recipe)")

    def over(self, recipe: TrainConfig) -> TrainConfig:
        """``recipe`` with every key that is set in place of its field (validated)."""
        return replace(recipe, **{f.name: getattr(self, f.name) for f in fields(RecipeKeys)
                                  if getattr(self, f.name) != FROM_MODEL[f.name]})


def keys_problems(keys: Recipe, names: Mapping[str, str] = MappingProxyType({})) -> list[str]:
    """What is wrong with the recipe keys of ``keys`` that are set (each named as ``names``
    says, and told what "not set" is), before any model's recipe fills the rest."""
    return [f"{problem} (or {FROM_MODEL[field]!r}: the model's recipe)"
            for field, ok, problem in _checks(keys, names)
            if not ok and getattr(keys, field) != FROM_MODEL[field]]
