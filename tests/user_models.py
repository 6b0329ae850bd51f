"""A user's own network for the bring-your-own-model tests: ``model =
"tests.user_models:tiny_bn"`` (a conv with BatchNorm, as most real networks have)."""

from __future__ import annotations

from torch import nn


def tiny_bn(in_channels: int, num_classes: int) -> nn.Module:
    """conv(3x3) -> BatchNorm -> ReLU -> global average pool -> linear: 8 channels."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))


def wrong_classes(in_channels: int, num_classes: int) -> nn.Module:
    """A network built for three classes whatever the dataset has (a user's mistake)."""
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(3))


def not_a_module(in_channels: int, num_classes: int) -> str:
    """A factory that returns no network (a user's mistake)."""
    return "resnet"
