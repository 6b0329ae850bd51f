"""The lockstep ``owen-paper`` equals the sequential Algorithm 1 value for value, and batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedowen_strategy.valuation import estimate
from fedowen_strategy.valuation._base import CachedGame
from fedowen_strategy.valuation.exact import all_coalitions
from fedowen_strategy.valuation.games import TableGame, interaction_game, voting_game
from tests.owen_paper_sequential import owen_paper_sequential
from tests.test_valuation_accuracy import FL_GAME

GAMES: dict[str, Any] = {
    "fl-mnist": TableGame.from_json(FL_GAME),
    "voting": voting_game(),
    # as a table: the additive game's float sums depend on the batch a row comes in, and the
    # two orders evaluate rows in different batches; equal values need batch-free utilities
    "interaction": TableGame(interaction_game()(all_coalitions(10))),
    "tiny": TableGame(np.array([0.0, 0.3, 0.5, 1.0])),  # n = 2: every walk soon all-cached
}


class Calls:
    """A game that counts utility calls and rows."""

    def __init__(self, game: Any) -> None:
        self.game, self.calls, self.rows = game, 0, 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        self.calls += 1
        self.rows += len(masks)
        return self.game(masks)


@pytest.mark.parametrize("game_name", list(GAMES))
@pytest.mark.parametrize("m", [1, 4, 10, 40])
@pytest.mark.parametrize(("levels", "eta"), [(2, 0.01), (2, 0.0), (4, 0.05), (1, 0.2)])
def test_lockstep_equals_sequential(game_name: str, m: int, levels: int, eta: float) -> None:
    # Prepare
    game = GAMES[game_name]
    n = game.n_players
    budget = max(2, n * m)
    for seed in range(5):
        seq_game = CachedGame(game, n, budget)
        # Execute
        expected = owen_paper_sequential(
            seq_game, np.random.default_rng(seed), levels=levels, eta=eta
        )
        got = estimate("owen-paper", game, n, budget=budget, seed=seed, levels=levels, eta=eta)
        # Assert: bit-identical values, same evaluations
        np.testing.assert_array_equal(got.values, expected)
        assert got.n_evals == seq_game.n_evals


def test_lockstep_needs_far_fewer_utility_calls() -> None:
    # Prepare
    game = GAMES["fl-mnist"]
    seq, lock = Calls(game), Calls(game)
    # Execute
    owen_paper_sequential(CachedGame(seq, 10, 400), np.random.default_rng(0))
    estimate("owen-paper", lock, 10, budget=400, seed=0)
    # Assert: same rows, a fraction of the calls (one per walk step, not one per row)
    assert lock.rows == seq.rows
    assert lock.calls * 4 <= seq.calls, (lock.calls, seq.calls)
