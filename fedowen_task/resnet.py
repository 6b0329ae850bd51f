"""ResNet-18 for 32x32 inputs (the CIFAR variant), with BatchNorm (``resnet18``) or with
GroupNorm (``resnet18-gn``), each with its own local-training recipe.

References
----------
He et al., "Deep residual learning for image recognition", CVPR 2016 (CIFAR variant: 3x3 stem
conv, stride 1, no max-pool).
Wu & He, "Group normalization", ECCV 2018. Hsieh et al., "The non-IID data quagmire of
decentralized machine learning", ICML 2020 (BatchNorm fails under label skew, GroupNorm
recovers most of it). Reddi et al., "Adaptive federated optimization", ICLR 2021 (ResNet-18
on CIFAR-10 with GroupNorm of 2 groups), as Flower's FedMLB baseline.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedowen_task.recipe import TrainConfig

#: GroupNorm's groups in ``resnet18-gn``: 2, as Reddi et al. (2021) and Flower's FedMLB
#: baseline train ResNet-18 on CIFAR-10 (every layer's 64-512 channels split in two halves).
GN_GROUPS = 2

#: ResNet-18's recipe: the base recipe at lr 0.01, picked by conf/backbone-dev.toml's rule
#: (equal-weight FedAvg on the app's CIFAR-10 split, 8 rounds, validation accuracy of rounds
#: 4-8 over development seeds 0-2: 12.98% at lr 0.01, 12.72% at 0.03;
#: docs/results/backbone-dev/). One local epoch from the initial model on a round of 10 clients
#: (<= 100 images each; docs/results/backbone-probe/) has a mean training loss of 1.42 at lr
#: 0.01, 1.90 at 0.03 and 2.82 at 0.05 (above the initial ln 10: diverging, as the shipped 0.05
#: did in docs/results/gpu-resnet18/).
RESNET18_RECIPE = TrainConfig(lr=0.01)
#: ResNet-18-GN's recipe: lr 0.003, picked by the same grid (10.41% against 10.17% at lr 0.01:
#: both near chance at 8 rounds). The probe: 1.78 at lr 0.003, 2.73 at 0.01, 4.71 at 0.03, 6.73
#: at 0.05 (GroupNorm's network diverges from 0.01 on with momentum 0.5 and batch 10).
RESNET18_GN_RECIPE = TrainConfig(lr=0.003)


Norm = Callable[[int], nn.Module]


def group_norm(channels: int) -> nn.Module:
    """GroupNorm of :data:`GN_GROUPS` groups over ``channels`` (no running statistics)."""
    return nn.GroupNorm(GN_GROUPS, channels)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs, each normalised by ``norm`` (BatchNorm unless told),
    identity or 1x1-conv shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1,
                 norm: Norm = nn.BatchNorm2d) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), norm(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 inputs (CIFAR variant): 3x3 stride-1 stem, no max-pool, BatchNorm
    (``norm``: :class:`ResNet18GN` passes GroupNorm; the layers keep their ``bn*`` names)."""

    recipe = RESNET18_RECIPE

    def __init__(self, in_channels: int, num_classes: int, norm: Norm = nn.BatchNorm2d) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = norm(64)
        layers: list[nn.Module] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(in_planes, planes, stride, norm),
                                        BasicBlock(planes, planes, norm=norm)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.stem(x)))
        h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
        return self.fc(torch.flatten(self.avgpool(h), 1))


class ResNet18GN(ResNet18):
    """ResNet-18 (CIFAR variant) with GroupNorm of :data:`GN_GROUPS` groups in place of every
    BatchNorm: the same convolutions and parameter count, no running statistics, so nothing
    but learned weights travels and no client's batch statistics enter the global model
    (Hsieh et al. 2020)."""

    recipe = RESNET18_GN_RECIPE

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__(in_channels, num_classes, norm=group_norm)
