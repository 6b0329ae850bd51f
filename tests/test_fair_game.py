"""The delta ("fair") coalition game: a client that changed nothing is exactly a null player."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedowen_strategy.round.contribution import ValuationSettings, value_round
from fedowen_strategy.round.round_valuers import delta_shares
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_strategy.torch_utility.batched import CoalitionGame, coalition_coefficients
from fedowen_task.models import build_model, state_to_numpy

# Estimators that keep the null-player axiom exactly (README's axiom table).
NULL_EXACT = ("exact", "owen", "owen-antithetic", "owen-paper", "mc-shapley", "gtg-shapley",
              "gtg-greedyfed", "weighted-shap", "loo", "first-order", "first-order-refined",
              "first-order-simpson")


def test_delta_coefficients_by_hand() -> None:
    masks = np.array([[True, False, True], [False, False, False], [True, True, True]])
    coef = coalition_coefficients(masks, [1, 2, 3], shares=[0.5, 0.25, 0.25])
    np.testing.assert_allclose(coef, [[0.5, 0, 0.25, 0.25], [0, 0, 0, 1], [0.5, 0.25, 0.25, 0]])
    with pytest.raises(ValueError, match="summing to 1"):
        coalition_coefficients(masks, [1, 2, 3], shares=[0.5, 0.5, 0.5])
    np.testing.assert_allclose(delta_shares("examples", [1, 3]), [0.25, 0.75])
    np.testing.assert_allclose(delta_shares("softmax", [1, 3]), [0.5, 0.5])


@pytest.fixture(scope="module")
def lenet_round() -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]], torch.Tensor,
                           torch.Tensor, torch.nn.Module]:
    """A LeNet global model, 5 clients of which client 2 returns the global model unchanged."""
    model = build_model("lenet", 1, 10, seed=0)
    rng = np.random.default_rng(0)
    glob = state_to_numpy(model)
    clients = []
    for i in range(5):
        clients.append({k: (v if i == 2 else v + rng.normal(0, 0.05, v.shape).astype(v.dtype))
                        for k, v in glob.items()})
    x = torch.randn(120, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (120,), generator=torch.Generator().manual_seed(2))
    return glob, clients, x, y, model


@pytest.mark.parametrize("method", NULL_EXACT)
def test_zero_update_is_a_null_player_in_the_delta_game(method: str, lenet_round: tuple) -> None:
    # Prepare
    glob, clients, x, y, model = lenet_round
    make = CoalitionUtility(model, x, y, metric="neg-loss", device="cpu")  # passes shares

    settings = ValuationSettings(method=method, budget_m=8, game="delta", phi_scale="raw",
                                 aggregation="uniform")
    # Execute
    val = value_round(clients, [40, 5, 500, 20, 30], glob, settings, make,
                      np.random.default_rng(3))
    # Assert: exactly zero for the null client, not for the others (their updates move the loss)
    assert val.phi_raw[2] == 0.0
    assert np.count_nonzero(val.phi_raw) >= 3


def test_average_game_pays_the_free_rider(lenet_round: tuple) -> None:
    # The average game dilutes the others' updates by the free rider's 500 examples, so it is
    # not a null player there: the reason the delta game exists.
    glob, clients, x, y, model = lenet_round
    util = CoalitionGame(model, glob, clients, [40, 5, 500, 20, 30], x, y, metric="neg-loss",
                            device="cpu")
    masks = np.array([[True, True, False, True, True], [True, True, True, True, True]])
    with_rider, without = util(masks[[1]])[0], util(masks[[0]])[0]
    assert with_rider != without


def test_delta_game_values_the_applied_aggregate_when_copies_share_a_weight(
        lenet_round: tuple) -> None:
    # Prepare: clients 0 and 3 return the same update (a copy); the server applies equal
    # weights with the copies sharing one member's weight
    glob, clients, x, y, model = lenet_round
    states = [clients[0], clients[1], clients[2], dict(clients[0]), clients[4]]
    make = CoalitionUtility(model, x, y, metric="neg-loss", device="cpu")
    settings = ValuationSettings(method="exact", game="delta", phi_scale="raw",
                                 aggregation="uniform")
    # Execute
    val = value_round(states, [1] * 5, glob, settings, make, np.random.default_rng(0),
                      groups=[[0, 3]])
    # Assert: weights 1/8 for each copy, 1/4 for the others; the game's grand coalition is
    # exactly the model those weights build, and the copies split their contribution evenly
    np.testing.assert_allclose(val.weights, [0.125, 0.25, 0.25, 0.125, 0.25])
    applied = {k: sum(w * s[k] for w, s in zip(val.weights, states, strict=True)) for k in glob}
    alone = make(glob, [applied], [1], shares=[1.0])(np.array([[True]]))[0]
    assert val.nu_full == pytest.approx(alone, abs=1e-5)
    assert val.phi_raw[0] == pytest.approx(val.phi_raw[3], abs=1e-6)
    assert val.phi_raw.sum() == pytest.approx(val.nu_full - val.nu_empty, abs=1e-6)
