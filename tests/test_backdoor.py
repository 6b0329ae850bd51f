"""The backdoor's trigger and metric (fedowen_task.adversary.backdoor), by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedowen_task.adversary.backdoor import attack_success, poison, stamp, trigger_mask
from fedowen_task.adversary.keys import Trigger
from fedowen_task.data import white


def test_the_trigger_stamps_exactly_its_pixels() -> None:
    # Prepare: a 3x3 square at the bottom right and a 3-pixel plus at the centre of 8x8
    square = Trigger(size=3, position="bottom-right")
    plus = Trigger(shape="plus", size=3, position="center")
    # Execute / Assert: hand-placed pixels (one-pixel margin at the corner)
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[4:7, 4:7] = True
    assert torch.equal(trigger_mask(square, 8, 8), expected)
    cross = torch.zeros(8, 8, dtype=torch.bool)
    cross[3, 2:5] = True
    cross[2:5, 3] = True
    assert torch.equal(trigger_mask(plus, 8, 8), cross)
    # every channel of the stamped pixels takes the value, nothing else moves
    x = torch.randn(2, 3, 8, 8)
    out = stamp(x, square, torch.tensor([7.0, 8.0, 9.0]).view(-1, 1, 1))
    assert torch.equal(out[:, :, ~expected], x[:, :, ~expected])
    assert torch.all(out[:, 0, expected] == 7.0) and torch.all(out[:, 2, expected] == 9.0)
    with pytest.raises(ValueError, match="does not fit"):
        trigger_mask(Trigger(size=7), 8, 8)


def test_poison_stamps_and_relabels_the_configured_share() -> None:
    # Prepare: 40 images, 25% poisoned to class 3
    trigger = Trigger(target=3, poison_fraction=0.25)
    x, y = torch.zeros(40, 1, 28, 28), torch.arange(40) % 10
    value = white("mnist")
    # Execute
    px, py, idx = poison(x, y, trigger, value, np.random.default_rng(0))
    # Assert: exactly 10 images changed, stamped and relabelled; the others untouched
    assert len(idx) == 10 and len(set(idx.tolist())) == 10
    changed = (px != x).flatten(1).any(dim=1)
    assert changed.nonzero().flatten().tolist() == sorted(idx.tolist())
    assert torch.all(py[idx] == 3) and torch.equal(py[~changed], y[~changed])
    assert float(value) == pytest.approx((1 - 0.1307) / 0.3081)
    # the same seed draws the same images
    assert np.array_equal(poison(x, y, trigger, value, np.random.default_rng(0))[2], idx)


class CornerModel(torch.nn.Module):
    """Answers class 0 when the bottom-right 3x3 patch is bright, else class 1 + the image's
    mean sign: a hand-built backdoored model."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bright = x[:, 0, 24:27, 24:27].mean(dim=(1, 2)) > 1.0
        out = torch.zeros(len(x), 10)
        out[bright, 0] = 1.0
        out[~bright, 1] = 1.0
        return out


def test_attack_success_on_a_hand_built_model() -> None:
    # Prepare: 10 images, 4 of the target class (left out of the rate)
    x = torch.zeros(10, 1, 28, 28)
    y = torch.tensor([0, 0, 0, 0, 1, 2, 3, 4, 5, 6])
    model = CornerModel()
    # Execute / Assert: every stamped non-target image goes to 0: 100%; a trigger elsewhere
    # does nothing: 0%; only target-class images: undefined
    assert attack_success(model, x, y, Trigger(target=0), white("mnist")) == 1.0
    assert attack_success(model, x, y, Trigger(target=0, position="top-left"),
                          white("mnist")) == 0.0
    assert np.isnan(attack_success(model, x[:4], y[:4], Trigger(target=0), white("mnist")))
