"""Tests for fedowen_task.models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedowen_task.models import MODELS, build_model, load_numpy_state, state_to_numpy


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
     ("cnn", (3, 32, 32), 10)],
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
