"""Tests for fedowen_strategy.torch_utility.forward: the rewritten network computes the same
logits, bit for bit, as the model it was made from."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedowen_strategy.torch_utility.forward import exact_max_pool2d, prepare_net, rewrite_pools
from fedowen_task.models import build_model


class _Pools(nn.Module):
    """Max-pools of every kind the rewrite meets: a module, an overlapping window (falls back),
    an odd side (falls back), a ReLU with a second user (must stay before the pool), and one
    returning indices (left as it is)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 3 * 3 + 4 * 7 * 7, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(self.relu(self.conv(x)))  # 14 -> 7, module form, ReLU moved after
        a = F.max_pool2d(h, 3, 2)  # overlapping: torch's own pool
        b = F.max_pool2d(h, 2)  # 7 is odd: torch's own pool
        r = F.relu(h)
        c = F.max_pool2d(r, kernel_size=(1, 1)) + r  # ReLU used twice: kept where it is
        c = c + F.max_pool2d(h, 1, return_indices=True)[0]
        return self.fc(torch.cat([torch.flatten(a, 1) + torch.flatten(b, 1)[:, :36],
                                  torch.flatten(c, 1)], 1))


def test_exact_max_pool_equals_torch_on_ties_and_negatives() -> None:
    # Prepare: integer-valued inputs make ties common; -0.0 and negatives included
    x = torch.randint(-3, 3, (4, 3, 8, 12)).float()
    x[0, 0, 0, 1] = -0.0
    # Execute / Assert
    for k in (2, 4, (2, 2)):
        assert torch.equal(exact_max_pool2d(x, k), F.max_pool2d(x, k))
    assert torch.equal(exact_max_pool2d(x, 2, stride=1), F.max_pool2d(x, 2, stride=1))


@pytest.mark.parametrize("batch", [1, 37, 128, 600])
def test_lenet_rewrite_is_bit_identical(batch: int) -> None:
    # Prepare
    model = build_model("lenet", 1, 10, seed=3).eval()
    net = prepare_net(model, torch.device("cpu"))
    x = torch.randn(batch, 1, 28, 28, generator=torch.Generator().manual_seed(batch)) * 3
    params = {k: v + 0.5 * torch.randn_like(v) for k, v in model.state_dict().items()}
    # Execute
    with torch.inference_mode():
        got = functional_call(net, params, (x,))
        expected = functional_call(model, params, (x,))
    # Assert
    assert isinstance(net, torch.fx.GraphModule)
    assert torch.equal(got, expected)


def test_rewrite_handles_modules_fallbacks_and_shared_relus() -> None:
    # Prepare
    model = _Pools().eval()
    x = torch.randn(6, 2, 14, 14, generator=torch.Generator().manual_seed(0))
    # Execute
    gm, count = rewrite_pools(model)
    # Assert: four pools go through exact_max_pool2d; one ReLU was moved after its pool
    assert count == 4
    assert sum(n.target is F.relu for n in gm.graph.nodes) == 1  # the shared one
    assert sum(n.target is F.max_pool2d_with_indices for n in gm.graph.nodes) == 1  # kept
    assert not any(isinstance(m, nn.MaxPool2d) for m in gm.modules())
    with torch.inference_mode():
        assert torch.equal(gm(x), model(x))
    assert set(gm.state_dict()) == set(model.state_dict())


def test_auto_keeps_models_without_pools_and_untraceable_models_eager() -> None:
    class Branchy(nn.Module):  # data-dependent control flow: torch.fx cannot trace it
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) if x.sum() > 0 else -self.fc(x)

    cpu = torch.device("cpu")
    resnet = prepare_net(build_model("resnet18", 3, 10, seed=0), cpu)  # no max-pool
    assert not isinstance(resnet, torch.fx.GraphModule)
    assert not isinstance(prepare_net(Branchy(), cpu), torch.fx.GraphModule)
    with pytest.raises(ValueError, match="cannot trace Branchy"):
        prepare_net(Branchy(), cpu, "rewrite")
    with pytest.raises(ValueError, match="forward='fast' must be one of"):
        prepare_net(Branchy(), cpu, "fast")
    assert not isinstance(prepare_net(build_model("lenet", 1, 10), cpu, "eager"),
                          torch.fx.GraphModule)
