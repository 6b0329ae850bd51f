"""Coalitions evaluated by several threads (CoalitionGame's ``workers``): the same values, bit
for bit, as one thread's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_task.models import build_model, state_to_numpy


def lenet_round(n: int, seed: int = 0) -> tuple[torch.nn.Module, dict, list[dict]]:
    """A LeNet global model and ``n`` perturbed client states."""
    rng = np.random.default_rng(seed)
    net = build_model("lenet", 1, 10, seed=seed)
    glob = state_to_numpy(net)
    states = [{k: v + (0.05 * rng.standard_normal(v.shape)).astype(v.dtype)
               if v.dtype.kind == "f" else v for k, v in glob.items()} for _ in range(n)]
    return net, glob, states


@pytest.mark.parametrize("delta", [True, False])
def test_values_are_bit_identical_whatever_the_number_of_workers(delta: bool) -> None:
    # Prepare: a 9-client round, 70 random images (an uneven last batch), 23 coalitions split
    # over 3 chunks of 8 so that blocks and chunks do not line up
    torch.manual_seed(0)
    net, glob, states = lenet_round(9)
    x, y = torch.randn(70, 1, 28, 28), torch.randint(0, 10, (70,))
    shares = np.full(9, 1 / 9).tolist() if delta else None
    masks = np.random.default_rng(1).random((23, 9)) < 0.5

    def values(workers: int) -> np.ndarray:
        factory = CoalitionUtility(net, x, y, metric="neg-loss", device="cpu", batch_size=32,
                                   chunk_size=8, workers=workers)
        return factory(glob, states, [10 + i for i in range(9)], shares=shares)(masks)

    # Execute
    one = values(1)
    # Assert: 2, 3 and more workers than coalitions in a chunk give the same bits
    for workers in (2, 3, 12):
        np.testing.assert_array_equal(values(workers), one)
    assert np.isfinite(one).all() and len(set(one.tolist())) > 1


def test_a_game_refuses_fewer_than_one_worker() -> None:
    net, glob, states = lenet_round(2)
    factory = CoalitionUtility(net, torch.randn(4, 1, 28, 28), torch.zeros(4, dtype=torch.long),
                               device="cpu", workers=0)
    with pytest.raises(ValueError, match="workers=0 must be >= 1"):
        factory(glob, states, [1, 1])
