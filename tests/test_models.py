"""Tests for fedowen_task.models."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedowen_task.models import (
    MODELS,
    build_model,
    load_numpy_state,
    model_recipe,
    state_to_numpy,
)
from fedowen_task.recipe import TrainConfig
from fedowen_task.resnet import GN_GROUPS
from fedowen_task.training import train


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _resnet18_params(in_channels: int, num_classes: int) -> int:
    """ResNet-18 (CIFAR variant) parameter count, derived layer by layer."""

    def conv(cin: int, cout: int, k: int) -> int:  # bias-free conv
        return cin * cout * k * k

    def bn(c: int) -> int:  # weight + bias (running stats are buffers)
        return 2 * c

    total = conv(in_channels, 64, 3) + bn(64)
    cin = 64
    for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        # first block: two 3x3 convs, plus a 1x1 projection shortcut when the shape changes
        total += conv(cin, planes, 3) + bn(planes) + conv(planes, planes, 3) + bn(planes)
        if stride != 1 or cin != planes:
            total += conv(cin, planes, 1) + bn(planes)
        # second block: two 3x3 convs, identity shortcut
        total += 2 * (conv(planes, planes, 3) + bn(planes))
        cin = planes
    return total + 512 * num_classes + num_classes


@pytest.mark.parametrize(
    ("name", "shape", "num_classes"),
    [("lenet", (1, 28, 28), 10), ("lenet", (1, 28, 28), 62), ("resnet18", (3, 32, 32), 10),
     ("resnet18-gn", (3, 32, 32), 10), ("cnn", (3, 32, 32), 10)],
)
def test_output_shape(name: str, shape: tuple[int, int, int], num_classes: int) -> None:
    # Prepare
    model = build_model(name, shape[0], num_classes, seed=0).eval()
    # Execute
    with torch.inference_mode():
        out = model(torch.zeros(2, *shape))
    # Assert
    assert out.shape == (2, num_classes)


def test_lenet_parameter_count_by_hand() -> None:
    # conv1: 1*6*5*5 + 6 = 156; conv2: 6*16*5*5 + 16 = 2416
    # fc1: 16*5*5*120 + 120 = 48120; fc2: 120*84 + 84 = 10164; fc3: 84*10 + 10 = 850
    expected = 156 + 2416 + 48120 + 10164 + 850
    assert expected == 61706
    assert _n_params(build_model("lenet", 1, 10, seed=0)) == expected


def test_small_cnn_parameter_count_by_hand() -> None:
    # stem: 3*6*5*5 + 6 = 456; conv2: 2416; fc1: 48120; fc2: 10164; fc3: 850 (as LeNet's)
    assert _n_params(build_model("cnn", 3, 10, seed=0)) == 456 + 2416 + 48120 + 10164 + 850


def test_resnet18_parameter_count() -> None:
    expected = _resnet18_params(3, 10)
    # 1728 + 128 (stem, bn1) + 147968 + 525568 + 2099712 + 8393728 (layers 1..4) + 5130 (fc)
    assert expected == 11_173_962
    assert _n_params(build_model("resnet18", 3, 10, seed=0)) == expected


@pytest.mark.parametrize("name", MODELS)
def test_seeded_init_reproducible_and_no_global_side_effect(name: str) -> None:
    # Prepare
    channels = 1 if name == "lenet" else 3
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    # Execute
    a = state_to_numpy(build_model(name, channels, 10, seed=7))
    b = state_to_numpy(build_model(name, channels, 10, seed=7))
    c = state_to_numpy(build_model(name, channels, 10, seed=8))
    # Assert
    assert torch.equal(before, torch.random.get_rng_state())
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["stem.weight"], c["stem.weight"])


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="lenet, resnet18"):
        build_model("vgg", 3, 10)


def test_numpy_state_roundtrip_includes_buffers() -> None:
    # Prepare
    src = build_model("resnet18", 3, 10, seed=1)
    dst = build_model("resnet18", 3, 10, seed=2)
    state = state_to_numpy(src)
    state["bn1.running_mean"] += 1.5
    # Execute
    load_numpy_state(dst, state)
    # Assert
    back = state_to_numpy(dst)
    assert "bn1.num_batches_tracked" in back
    assert all(np.array_equal(state[k], back[k]) for k in state)


def test_resnet18_gn_has_resnet18s_parameters_and_no_running_statistics() -> None:
    # Prepare: GroupNorm has the same affine weight and bias per channel as BatchNorm
    bn = build_model("resnet18", 3, 10, seed=0)
    gn = build_model("resnet18-gn", 3, 10, seed=0)
    # Assert: 11,173,962 parameters (as ResNet-18's, counted by hand above), no buffers
    assert _n_params(gn) == _resnet18_params(3, 10) == 11_173_962
    assert list(gn.buffers()) == []
    assert set(state_to_numpy(gn)) == {k for k in state_to_numpy(bn)
                                       if not k.endswith(("running_mean", "running_var",
                                                          "num_batches_tracked"))}
    norms = [m for m in gn.modules() if isinstance(m, torch.nn.GroupNorm)]
    # stem + 8 blocks x 2 + 3 projection shortcuts: 20 norms, each of 2 groups
    assert len(norms) == 20 and {m.num_groups for m in norms} == {GN_GROUPS} == {2}
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in gn.modules())


def test_resnet18_gn_normalises_each_sample_alone() -> None:
    # Prepare: GroupNorm uses no batch statistics, so a sample's logits do not depend on the
    # other samples of its batch, in training mode as in eval mode
    model = build_model("resnet18-gn", 3, 10, seed=0).train()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    # Execute
    with torch.no_grad():
        together = model(x)
        alone = model(x[:1])
    # Assert
    assert together.shape == (4, 10)
    assert torch.allclose(together[:1], alone, atol=1e-5)


def test_resnet18_gn_trains_a_step_on_cifar_shapes() -> None:
    # Prepare: 20 CIFAR-shaped images, two batches of 10, its own recipe
    model = build_model("resnet18-gn", 3, 10, seed=0)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 3, 32, 32, generator=gen), torch.arange(20) % 10
    before = state_to_numpy(model)
    # Execute
    stats = train(model, x, y, seed=0, **model_recipe("resnet18-gn").train_kwargs())
    # Assert: a finite loss near ln 10 at the start, every parameter tensor moved
    after = state_to_numpy(model)
    assert math.isfinite(stats["loss"]) and 1.5 < stats["loss"] < 4.0
    assert stats["num_examples"] == 20
    assert all(not np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(("name", "lr"), [("lenet", 0.05), ("cnn", 0.05), ("resnet18", 0.01),
                                          ("resnet18-gn", 0.003)])
def test_every_built_in_carries_its_recipe(name: str, lr: float) -> None:
    # Assert: LeNet's and the CNN's are the base recipe exactly; ResNet-18's differ in lr only
    assert set(MODELS) == {"lenet", "cnn", "resnet18", "resnet18-gn"}
    assert model_recipe(name) == replace(TrainConfig(), lr=lr)
    assert TrainConfig() == TrainConfig(lr=0.05, momentum=0.5, batch_size=10, local_epochs=1,
                                        weight_decay=0.0)
