"""First-order terms of the torch delta game: one backward pass, against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_strategy.torch_utility.batched import CoalitionGame
from fedowen_strategy.valuation import estimate
from fedowen_task.models import build_model, load_numpy_state, state_to_numpy

SHARES = np.array([0.1, 0.2, 0.3, 0.25, 0.15])


@pytest.fixture(scope="module")
def round_in_double() -> tuple[torch.nn.Module, dict, list[dict], torch.Tensor, torch.Tensor]:
    """LeNet in float64 (so finite differences are precise), 5 updates, client 2's zero."""
    torch.set_num_threads(1)
    model = build_model("lenet", 1, 10, seed=0).double()
    rng = np.random.default_rng(0)
    glob = state_to_numpy(model)
    clients = [{k: v if i == 2 else v + rng.normal(0, 0.02, v.shape) for k, v in glob.items()}
               for i in range(5)]
    x = torch.randn(60, 1, 28, 28, generator=torch.Generator().manual_seed(1)).double()
    y = torch.randint(0, 10, (60,), generator=torch.Generator().manual_seed(2))
    return model, glob, clients, x, y


def neg_loss(model: torch.nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor) -> float:
    net = build_model("lenet", 1, 10).double()
    load_numpy_state(net, state)
    with torch.no_grad():
        return -float(F.cross_entropy(net.eval()(x), y))


@pytest.mark.parametrize("at", [0.0, 0.5, 1.0])
def test_terms_match_central_differences(at: float, round_in_double: tuple) -> None:
    # Prepare
    model, glob, clients, x, y = round_in_double
    game = CoalitionGame(model, glob, clients, [1] * 5, x, y, metric="neg-loss", device="cpu",
                         shares=SHARES, batch_size=25)
    step = {k: sum(p * (c[k] - glob[k]) for p, c in zip(SHARES, clients, strict=True))
            for k in glob}
    h = 1e-5
    # Execute
    terms = game.first_order(at)
    # Assert: dF/dx_i at (at, ..., at), F(x) = u(global + sum_i x_i p_i delta_i)
    for i, (p, c) in enumerate(zip(SHARES, clients, strict=True)):
        def at_x(e: float, p: float = p, c: dict = c) -> dict:
            return {k: glob[k] + at * step[k] + e * p * (c[k] - glob[k]) for k in glob}
        fd = (neg_loss(model, at_x(h), x, y) - neg_loss(model, at_x(-h), x, y)) / (2 * h)
        assert terms[i] == pytest.approx(fd, rel=1e-4, abs=1e-9)
    assert terms[2] == 0.0


def test_terms_are_cached_and_counted(round_in_double: tuple) -> None:
    model, glob, clients, x, y = round_in_double
    game = CoalitionGame(model, glob, clients, [1] * 5, x, y, metric="neg-loss", device="cpu",
                         shares=SHARES)
    a, b = game.first_order(0.5), game.first_order(0.5)
    np.testing.assert_array_equal(a, b)
    assert game.n_backward == 1 and game.n_model_evals == 0


def test_first_order_estimate_through_the_registry(round_in_double: tuple) -> None:
    # Prepare
    model, glob, clients, x, y = round_in_double
    game = CoalitionGame(model, glob, clients, [1] * 5, x, y, metric="neg-loss", device="cpu",
                         shares=SHARES)
    # Execute
    result = estimate("first-order", game, 5, budget=10, seed=0)
    # Assert: two evaluations (the ends), one backward pass, the null client exactly 0
    assert (result.n_evals, result.n_gradients, game.n_backward) == (2, 1, 1)
    assert result.values[2] == 0.0 and np.count_nonzero(result.values) == 4


def test_average_game_and_accuracy_have_no_first_order_terms(round_in_double: tuple) -> None:
    model, glob, clients, x, y = round_in_double
    average = CoalitionGame(model, glob, clients, [1] * 5, x, y, metric="neg-loss",
                            device="cpu")
    with pytest.raises(ValueError, match="delta game only"):
        average.first_order(0.5)
    accuracy = CoalitionGame(model, glob, clients, [1] * 5, x, y, metric="accuracy",
                             device="cpu", shares=SHARES)
    with pytest.raises(ValueError, match="metric='neg-loss'"):
        accuracy.first_order(0.5)
    with pytest.raises(ValueError, match=r"at=1.5 must lie in \[0, 1\]"):
        CoalitionGame(model, glob, clients, [1] * 5, x, y, metric="neg-loss", device="cpu",
                      shares=SHARES).first_order(1.5)


def test_backward_passes_run_through_the_eager_model_once_a_run(round_in_double: tuple
                                                                 ) -> None:
    # Prepare: on the CPU the forwards run through the pool rewrite (a torch.fx module)
    model, glob, clients, x, y = round_in_double
    utility = CoalitionUtility(model, x, y, metric="neg-loss", device="cpu")
    first = utility(glob, clients, [1] * 5, shares=SHARES)
    eager = CoalitionGame(model, glob, clients, [1] * 5, x, y, metric="neg-loss",
                          device="cpu", shares=SHARES, forward="eager")
    # Execute
    terms = first.first_order(0.5)
    second = utility(glob, clients, [1] * 5, shares=SHARES)
    # Assert: the forwards' net is the rewrite, the backward's the eager model, built once
    # for the run, and the terms are the eager game's bit for bit
    assert isinstance(first._net, torch.fx.GraphModule)
    assert not isinstance(first.gradient_net(), torch.fx.GraphModule)
    assert second.gradient_net() is first.gradient_net()
    np.testing.assert_array_equal(terms, eager.first_order(0.5))


@pytest.mark.parametrize("method", ["first-order-simpson", "first-order-refined"])
def test_gradient_passes_give_the_ends_at_no_forward(method: str) -> None:
    # Prepare: LeNet in float32 as the app runs it, 5 updates, client 2's zero
    torch.set_num_threads(1)
    model = build_model("lenet", 1, 10, seed=0)
    rng = np.random.default_rng(0)
    glob = state_to_numpy(model)
    clients = [{k: v if i == 2 else (v + rng.normal(0, 0.05, v.shape)).astype(v.dtype)
                for k, v in glob.items()} for i in range(5)]
    x = torch.randn(90, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (90,), generator=torch.Generator().manual_seed(2))

    def game() -> CoalitionGame:
        return CoalitionGame(model, glob, clients, [1] * 5, x, y, metric="neg-loss",
                             device="cpu", shares=SHARES, batch_size=40)

    forwards = game()
    ends = forwards(np.array([[False] * 5, [True] * 5]))
    # Execute
    primed = game()
    result = estimate(method, primed, 5, budget=12, seed=0)
    # Assert: both ends came from the backward passes (no forward for them), within float
    # rounding of the coalition forwards' values; the budget still counts them
    assert result.n_evals >= 2 and result.n_gradients == 3 == primed.n_backward
    assert primed.n_model_evals == result.n_evals - 2
    np.testing.assert_allclose([result.v_empty, result.v_grand], ends, rtol=1e-6)
    assert result.values[2] == 0.0
    # ...and phi is the game's whose ends a forward scored, within the same rounding
    reference = game()
    reference(np.array([[False] * 5, [True] * 5]))
    again = estimate(method, reference, 5, budget=12, seed=0)
    assert reference.n_model_evals == again.n_evals
    np.testing.assert_allclose(result.values, again.values, rtol=1e-5, atol=1e-9)
