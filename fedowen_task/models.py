"""Models shared by the client and server apps: LeNet-5, a small CNN for 32x32 images, a
CIFAR-style ResNet-18 with BatchNorm (``resnet18``) or with GroupNorm (``resnet18-gn``), or
the user's own network.

``model = "package.module:factory"`` names a callable ``factory(in_channels, num_classes) ->
nn.Module``, imported the same way by the ServerApp and every ClientApp (so the module must be
importable by both: inside the app's folder, which ``flwr run`` ships, or installed). Any
network with BatchNorm works: its buffers travel with the parameters (the buffer rule of
:mod:`fedowen_strategy.updates`).

Each built-in carries its local-training recipe as a ``recipe`` attribute (a
:class:`~fedowen_task.recipe.TrainConfig`; :func:`model_recipe`); a user's factory may carry
one the same way (a ``TrainConfig`` or a mapping of its fields), else it trains with the base
recipe (LeNet's). The run-config keys override any of it (``TaskConfig.train_config``).

The first layer of each is called ``stem`` (its arrays are ``stem.weight`` / ``stem.bias`` in
every checkpoint and ArrayRecord).

References
----------
LeCun et al., "Gradient-based learning applied to document recognition", Proc. IEEE 1998.
ResNet-18 and its references: :mod:`fedowen_task.resnet`.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedowen_task.recipe import TrainConfig
from fedowen_task.resnet import ResNet18, ResNet18GN

logger = logging.getLogger(__name__)

MODELS = ("lenet", "resnet18", "resnet18-gn", "cnn")


class LeNet5(nn.Module):
    """LeNet-5 for 28x28 inputs: conv(5x5, pad 2) -> pool -> conv(5x5) -> pool -> 120 -> 84 -> C."""

    #: The first convolution's padding: 2 keeps a 28x28 input's 5x5 maps after two pools.
    STEM_PADDING = 2
    #: The recipe the confirmation's tuning picked (:class:`~fedowen_task.recipe.TrainConfig`'s
    #: defaults; the small CNN inherits it).
    recipe = TrainConfig()

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 6, kernel_size=5, padding=self.STEM_PADDING)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.stem(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = torch.flatten(h, 1)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


class SmallCNN(LeNet5):
    """A small CNN for 32x32 inputs (PyTorch's CIFAR-10 tutorial network, Flower's quickstart):
    LeNet-5 without the stem's padding, conv(5x5) -> pool -> conv(5x5) -> pool -> 120 -> 84 ->
    C, 62k parameters for CIFAR-10.

    For CPU experiments on CIFAR-10 where ResNet-18 (11.2M parameters) is too slow to value
    thousands of coalitions (benchmarks/record_app_games.py); select it with ``model = "cnn"``.
    """

    STEM_PADDING = 0


_BUILDERS: dict[str, Callable[[int, int], nn.Module]] = {
    "lenet": LeNet5, "resnet18": ResNet18, "resnet18-gn": ResNet18GN, "cnn": SmallCNN}


Factory = Callable[[int, int], nn.Module]


def model_factory(name: str) -> Factory:
    """The builder of ``name``: a built-in (``MODELS``) or ``package.module:factory``.

    Raises
    ------
    ValueError
        Naming the ``model`` key when the name is neither, or the factory cannot be imported.
    """
    if name in _BUILDERS:
        return _BUILDERS[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"model={name!r} is not one of {', '.join(MODELS)} nor "
                         "'package.module:factory' (a callable (in_channels, num_classes) -> "
                         "nn.Module)")
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"model={name!r}: cannot import it ({type(err).__name__}: {err}); the module must "
            "be importable by the ServerApp and every ClientApp (put it in the app's folder, "
            "which `flwr run` ships, or install it)") from err
    if not callable(obj):
        raise ValueError(f"model={name!r}: {attr!r} is a {type(obj).__name__}, not a callable "
                         "(in_channels, num_classes) -> nn.Module")
    return obj


def model_problems(name: str) -> list[str]:
    """Why ``model = name`` cannot be used (empty when it can): ``auto``, a built-in, or an
    importable ``package.module:factory``."""
    if name == "auto":
        return []
    try:
        model_factory(name)
    except ValueError as err:
        return [str(err)]
    return []


def model_recipe(name: str) -> TrainConfig:
    """The recipe ``model = name`` trains with where no run-config key overrides it.

    A built-in's ``recipe`` attribute; a user's factory's ``recipe`` attribute, a
    :class:`~fedowen_task.recipe.TrainConfig` or a mapping of some of its fields (snake- or
    kebab-case: ``{"lr": 0.01, "batch-size": 20}``; the rest are the base recipe's, LeNet's);
    a factory without one: the base recipe, ``TrainConfig()``.

    Raises
    ------
    ValueError
        Naming the ``model`` key when the declared recipe is not one, or invalid.
    """
    declared: Any = getattr(model_factory(name), "recipe", None)
    if declared is None or isinstance(declared, TrainConfig):
        return declared or TrainConfig()
    if not isinstance(declared, Mapping):
        raise ValueError(f"model={name!r}: its recipe attribute is a {type(declared).__name__};"
                         " expected a fedowen_task.recipe.TrainConfig or a mapping of its "
                         "fields (e.g. {'lr': 0.01})")
    names = [f.name for f in fields(TrainConfig)]
    given = {str(k).replace("-", "_"): v for k, v in declared.items()}
    if unknown := sorted(set(given) - set(names)):
        raise ValueError(f"model={name!r}: its recipe names {', '.join(unknown)}, not fields "
                         f"of the recipe ({', '.join(names)})")
    try:
        return TrainConfig(**given)
    except (TypeError, ValueError) as err:
        raise ValueError(f"model={name!r}: its recipe {dict(declared)!r} is invalid: "
                         f"{err}") from err


def build_model(
    name: str, in_channels: int, num_classes: int, *, seed: int | None = None
) -> nn.Module:
    """Build a model by name.

    Parameters
    ----------
    name : str
        One of ``MODELS``, or ``package.module:factory`` (see the module docstring).
    in_channels, num_classes : int
        Taken from the dataset (e.g. 1 and 10 for MNIST, 3 and 10 for CIFAR-10).
    seed : int or None
        Seeds the weight initialisation inside a forked RNG, so the global torch RNG is left
        untouched. ``None`` draws from the global torch RNG.

    Returns
    -------
    nn.Module
        The model, in training mode, on the CPU.
    """
    builder = model_factory(name)
    if in_channels <= 0 or num_classes <= 0:
        raise ValueError(
            f"in_channels and num_classes must be positive, got {in_channels} and {num_classes}"
        )
    if seed is None:
        return _built(name, builder, in_channels, num_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _built(name, builder, in_channels, num_classes)


def _built(name: str, builder: Factory, in_channels: int, num_classes: int) -> nn.Module:
    """``builder(in_channels, num_classes)``, or an error naming the ``model`` key."""
    if name in _BUILDERS:
        return builder(in_channels, num_classes)
    try:
        model = builder(in_channels, num_classes)
    except Exception as err:  # a user's factory may raise anything
        raise ValueError(f"model={name!r}: the factory raised {type(err).__name__}: {err} "
                         f"when called as factory(in_channels={in_channels}, "
                         f"num_classes={num_classes})") from err
    if not isinstance(model, nn.Module):
        raise ValueError(f"model={name!r}: the factory returned a {type(model).__name__}, "
                         "not a torch.nn.Module")
    return model


def check_model_input(model: nn.Module, name: str, x: torch.Tensor, num_classes: int) -> None:
    """Run ``model`` (a copy's eval mode: no statistic moves) on two of the dataset's inputs
    ``x`` and require ``(2, num_classes)`` logits; a ValueError naming the ``model`` key
    otherwise (a user's network built for another input size or class count)."""
    import copy

    net = copy.deepcopy(model).eval()
    sample = x[:2]
    try:
        with torch.no_grad():
            out = net(sample)
    except Exception as err:  # shape errors surface as RuntimeError, a user's code as anything
        raise ValueError(f"model={name!r} cannot run on the dataset's input of shape "
                         f"{list(sample.shape[1:])}: {type(err).__name__}: {err}") from err
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(sample), num_classes):
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"model={name!r} returned {got} for {len(sample)} inputs of shape "
                         f"{list(sample.shape[1:])}; expected logits [{len(sample)}, "
                         f"{num_classes}] (one per class of the dataset)")


def state_to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """Copy a model's ``state_dict`` (parameters and buffers) to numpy arrays."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_numpy_state(model: nn.Module, state: Mapping[str, np.ndarray]) -> None:
    """Load numpy arrays into ``model`` in place (strict: keys must match exactly)."""
    tensors = {k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}
    model.load_state_dict(tensors, strict=True)
