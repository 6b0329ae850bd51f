"""A user's own networks that declare a local-training recipe (``model =
"tests.user_recipes:with_mapping"``): the ``recipe`` attribute of the factory, a mapping of
the recipe's fields or a :class:`~fedowen_task.recipe.TrainConfig` (fedowen_task.models)."""

from __future__ import annotations

from torch import nn

from fedowen_task.recipe import TrainConfig


def _tiny(in_channels: int, num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))


def with_mapping(in_channels: int, num_classes: int) -> nn.Module:
    """Declares two fields, kebab-case as in the run config; the rest are the base recipe's."""
    return _tiny(in_channels, num_classes)


with_mapping.recipe = {"lr": 0.02, "batch-size": 20}  # type: ignore[attr-defined]


def with_train_config(in_channels: int, num_classes: int) -> nn.Module:
    """Declares a whole TrainConfig."""
    return _tiny(in_channels, num_classes)


with_train_config.recipe = TrainConfig(  # type: ignore[attr-defined]
    lr=0.1, momentum=0.9, batch_size=32, local_epochs=2, weight_decay=5e-4)


def bad_value(in_channels: int, num_classes: int) -> nn.Module:
    """Declares a momentum no SGD takes (a user's mistake)."""
    return _tiny(in_channels, num_classes)


bad_value.recipe = {"momentum": 1.5}  # type: ignore[attr-defined]


def unknown_field(in_channels: int, num_classes: int) -> nn.Module:
    """Declares a field the recipe does not have (a user's mistake)."""
    return _tiny(in_channels, num_classes)


unknown_field.recipe = {"learning-rate": 0.1}  # type: ignore[attr-defined]
