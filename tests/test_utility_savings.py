"""Issue 71's savings in the coalition utility, each against the path it replaced: a zero update
shares its coalitions' forwards (values and phi bit for bit, forwards counted honestly), and
channels-last forwards (large models on the CPU) move the values by float32 rounding only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedowen_strategy.torch_utility.batched import CoalitionGame
from fedowen_strategy.torch_utility.forward import (
    CHANNELS_LAST_MIN_PARAMS,
    choose_memory_format,
)
from fedowen_strategy.valuation import estimate
from fedowen_task.models import build_model, state_to_numpy

N = 5
CPU = torch.device("cpu")


class EveryCoalitionGame(CoalitionGame):
    """The utility before issue 71: no player left out of the cache's key."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._zero = np.zeros(self.n, dtype=bool)


def _lenet_round(zero: tuple[int, ...] = ()) -> tuple[torch.nn.Module, dict, list, torch.Tensor,
                                                       torch.Tensor]:
    """A LeNet delta game's inputs: N clients, those in ``zero`` sending the global model."""
    rng = np.random.default_rng(5)
    model = build_model("lenet", 1, 10, seed=5)
    glob = state_to_numpy(model)
    clients = [{k: (v + rng.normal(0, 0.05, v.shape)).astype(v.dtype) if i not in zero
                else v.copy() for k, v in glob.items()} for i in range(N)]
    gen = torch.Generator().manual_seed(5)
    return model, glob, clients, torch.randn(24, 1, 28, 28, generator=gen), \
        torch.randint(0, 10, (24,), generator=gen)


def _game(cls: type[CoalitionGame], zero: tuple[int, ...] = (), **options: object
          ) -> CoalitionGame:
    model, glob, clients, x, y = _lenet_round(zero)
    return cls(model, glob, clients, [1] * N, x, y, device="cpu", shares=[1 / N] * N,
               batch_size=12, **options)  # type: ignore[arg-type]


def test_a_zero_update_shares_its_coalitions_forwards() -> None:
    # Prepare: client 2 sent the global model back; every coalition with and without it
    masks = np.array([[m >> i & 1 for i in range(N)] for m in range(2**N)], dtype=bool)
    game, before = _game(CoalitionGame, zero=(2,)), _game(EveryCoalitionGame, zero=(2,))
    # Execute
    got, old = game(masks), before(masks)
    # Assert: the same bits as evaluating every coalition, with half the forwards
    np.testing.assert_array_equal(got, old)
    assert before.n_model_evals == 2**N and game.n_model_evals == 2 ** (N - 1)
    without_2 = np.arange(2**N) & ~(1 << 2)  # row m is the coalition of m's bits
    np.testing.assert_array_equal(got, got[without_2])
    assert len(np.unique(got)) == 2 ** (N - 1)  # the check is not vacuous


def test_phi_and_n_evals_unchanged_by_the_shared_forwards() -> None:
    # Prepare: two zero updates; the default estimator at M = 4 over each utility
    zero = (1, 4)
    game, before = _game(CoalitionGame, zero=zero), _game(EveryCoalitionGame, zero=zero)
    # Execute
    new = estimate("owen-antithetic", game, N, budget=4 * N, seed=3)
    old = estimate("owen-antithetic", before, N, budget=4 * N, seed=3)
    # Assert: phi bit for bit, the budget charged the same; the forwards are what ran
    np.testing.assert_array_equal(new.values, old.values)
    assert new.n_evals == old.n_evals == before.n_model_evals
    assert game.n_model_evals < before.n_model_evals
    assert new.values[1] == 0.0 and new.values[4] == 0.0  # exact null players
    assert np.all(new.values[[0, 2, 3]] != 0.0)


def test_the_memory_format_rule() -> None:
    # Prepare
    images, rows = torch.zeros(2, 3, 32, 32), torch.zeros(2, 10)
    small, large = 61_706, 11_173_962  # LeNet, ResNet-18 (floating entries)
    # Execute
    rule = {(name, mode, size, x.dim()): choose_memory_format("auto", dev, mode, size, x)
            for name, dev in (("cpu", CPU), ("cuda", torch.device("cuda")))
            for mode in ("loop", "vmap") for size in (small, large) for x in (images, rows)}
    # Assert: channels-last only for large image models looped on the CPU
    last = [key for key, fmt in rule.items() if fmt == torch.channels_last]
    assert last == [("cpu", "loop", large, 4)]
    assert small < CHANNELS_LAST_MIN_PARAMS <= large
    assert choose_memory_format("channels-last", CPU, "loop", small, images) == \
        torch.channels_last
    assert choose_memory_format("contiguous", CPU, "loop", large, images) == \
        torch.contiguous_format


@pytest.mark.parametrize(("value", "mode", "x_dim", "match"), [
    ("nhwc", "loop", 4, "memory_format='nhwc' must be one of"),
    ("channels-last", "vmap", 4, "needs 4-D image batches in loop mode"),
    ("channels-last", "loop", 2, "got 2-D inputs"),
])
def test_memory_format_errors_name_the_value(value: str, mode: str, x_dim: int,
                                             match: str) -> None:
    x = torch.zeros((2, 3, 8, 8) if x_dim == 4 else (2, 3))
    with pytest.raises(ValueError, match=match):
        choose_memory_format(value, CPU, mode, 10, x)


def test_channels_last_moves_values_by_rounding_only() -> None:
    # Prepare: the same game in both formats; client 3 a zero update
    masks = np.array([[m >> i & 1 for i in range(N)] for m in range(2**N)], dtype=bool)
    last = _game(CoalitionGame, zero=(3,), memory_format="channels-last")
    contiguous = _game(CoalitionGame, zero=(3,), memory_format="contiguous")
    # Execute
    got, old = last(masks), contiguous(masks)
    phi = estimate("exact", last, N, budget=2**N, seed=0).values
    phi_old = estimate("exact", contiguous, N, budget=2**N, seed=0).values
    # Assert: the stated bound, 1e-6 of the utility (float32 rounding of a mean
    # cross-entropy near 2.3), on every value and every exact Shapley value
    assert last.memory_format == torch.channels_last
    assert contiguous.memory_format == torch.contiguous_format
    bound = 1e-6 * np.abs(old).max()
    np.testing.assert_allclose(got, old, rtol=0, atol=bound)
    np.testing.assert_allclose(phi, phi_old, rtol=0, atol=bound)
    assert np.ptp(phi_old) > 100 * bound  # the bound is far below the values' spread
    assert phi[3] == 0.0 and phi_old[3] == 0.0  # the null player stays exact


def test_resnet18_games_take_channels_last_on_the_cpu() -> None:
    # Prepare: tests/test_utility.py compares ResNet-18's loop mode with the naive reference;
    # this checks that its default path is the channels-last one
    model = build_model("resnet18", 3, 10, seed=0)
    state = state_to_numpy(model)
    x, y = torch.zeros(2, 3, 32, 32), torch.zeros(2, dtype=torch.long)
    # Execute
    game = CoalitionGame(model, state, [state, state], [1, 1], x, y, device="cpu",
                         shares=[0.5, 0.5], chunk_size=1)
    # Assert: and both updates are zero, so every coalition is the global model's one forward
    assert game.memory_format == torch.channels_last
    values = game(np.array([[False, False], [True, False], [True, True]]))
    assert len(set(values.tolist())) == 1 and game.n_model_evals == 1
