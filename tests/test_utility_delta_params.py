"""The delta game's coalition parameters: the member-only sum (issue 27, point 4) gives the
rows the old every-client sum gave, bit for bit, and so the same utilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_strategy.torch_utility.coalitions import coalition_coefficients, delta_params
from fedowen_task.models import build_model, state_to_numpy


def every_client_sum(base: torch.Tensor, deltas: torch.Tensor, coef: torch.Tensor
                     ) -> torch.Tensor:
    """The construction before issue 27 (still the GPU's): every client's term added to
    every row, written out here independently of the library."""
    theta = base.expand(len(coef), -1).clone()
    for i in range(deltas.shape[0]):
        theta += coef[:, i : i + 1] * deltas[i]
    return theta


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_delta_params_bit_identical_to_every_client_sum(seed: int) -> None:
    # Prepare: 40 players, one zero update, coalitions of every size incl. empty and full
    rng = np.random.default_rng(seed)
    n, size = 40, 5000
    base = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
    deltas = torch.from_numpy((1e-2 * rng.standard_normal((n, size))).astype(np.float32))
    deltas[7] = 0.0
    masks = rng.random((30, n)) < rng.random((30, 1))
    masks[0], masks[1] = False, True
    shares = rng.dirichlet(np.ones(n)).tolist()
    coef = torch.from_numpy(coalition_coefficients(masks, [1] * n, shares)).float()

    # Execute
    new = delta_params(base, deltas, coef)
    old = every_client_sum(base, deltas, coef)
    all_rows = delta_params(base, deltas, coef, members_only=False)

    # Assert: the same bits; the empty coalition is the base; the zero update adds nothing
    assert torch.equal(new, old)
    assert torch.equal(all_rows, old)
    assert torch.equal(new[0], base)
    with_null = masks.copy()
    with_null[:, 7] = True
    coef_null = torch.from_numpy(coalition_coefficients(with_null, [1] * n, shares)).float()
    # the shares of the others are unchanged, so the rows differ only by p_7 * 0
    coef_without = coef_null.clone()
    coef_without[:, 7] = 0.0
    assert torch.equal(delta_params(base, deltas, coef_null),
                       delta_params(base, deltas, coef_without))


def test_game_values_unchanged_by_member_only_sum() -> None:
    # Prepare: a LeNet delta game of 12 perturbed clients on 64 random images
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    net = build_model("lenet", 1, 10, seed=0)
    glob = state_to_numpy(net)
    states = [{k: v + (0.05 * rng.standard_normal(v.shape)).astype(v.dtype)
               if v.dtype.kind == "f" else v for k, v in glob.items()} for _ in range(12)]
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    shares = rng.dirichlet(np.ones(12)).tolist()
    game = CoalitionUtility(net, x, y, metric="neg-loss", device="cpu")(
        glob, states, [10] * 12, shares=shares)
    masks = rng.random((20, 12)) < 0.5

    # Execute: the game's values, and the same forwards on the old construction's parameters
    values = game(masks)
    coef = torch.from_numpy(coalition_coefficients(masks, game.num_examples, shares)).float()
    assert game._deltas is not None
    theta = every_client_sum(game._stacked[12], game._deltas, coef)
    with torch.inference_mode():
        expected = game._sums_loop(game._params(theta)).numpy() / len(x)

    # Assert
    np.testing.assert_array_equal(values, expected)
