"""``gtg-greedyfed``: GTG-Shapley as GreedyFed's code runs it, on closed-form games (the peers
spec's hand numbers, section 1f), with its permutations and evaluation counts."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.valuation import estimate
from fedowen_strategy.valuation._base import CachedGame
from fedowen_strategy.valuation.games import TableGame
from fedowen_strategy.valuation.gtg import TRUNCATED, converged, gtg_run, guided_orders

#: v(empty) = 0, v({0}) = 0.5, v({1}) = 0.3, v({0, 1}) = 0.6: Shapley values (0.4, 0.2).
TWO = TableGame(np.array([0.0, 0.5, 0.3, 0.6]))
#: 3 clients, every non-empty coalition worth 0.59995 (= v(N)): each walk stops after its
#: first step, so only the leader is credited.
FLAT_THREE = TableGame(np.r_[0.0, np.full(7, 0.59995)])


class Uncached:
    """A game in CachedGame's shape that charges every row it is asked for, as GreedyFed's
    reference does (it re-evaluates repeated coalitions), and counts them."""

    def __init__(self, game: TableGame) -> None:
        self.game, self.n_players, self.rows = game, game.n_players, 0
        self.remaining = 10**9

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        self.rows += len(masks)
        return self.game(masks)

    def ends(self) -> tuple[float, float]:
        v = self(np.array([np.zeros(self.n_players, bool), np.ones(self.n_players, bool)]))
        return float(v[0]), float(v[1])


def test_two_clients_give_the_exact_shapley_values_after_20_permutations() -> None:
    # Execute
    result = estimate("gtg-greedyfed", TWO, 2, budget=100, seed=0)
    values, permutations = gtg_run(CachedGame(TWO, 2, 100), np.random.default_rng(0))
    uncached = Uncached(TWO)
    gtg_run(uncached, np.random.default_rng(0))  # type: ignore[arg-type]
    # Assert: perms [0, 1] and [1, 0] alternate, so every sweep averages to (0.4, 0.2); the
    # players' mean is 0.3 after every permutation, so the test passes once the history has
    # 20 entries (19 permutations), at the end of sweep 10
    np.testing.assert_allclose(result.values, [0.4, 0.2], atol=1e-12)
    np.testing.assert_allclose(values, [0.4, 0.2], atol=1e-12)
    assert permutations == 20
    # the library charges the 4 coalitions once each; the reference's 42 evaluations are
    # 2 + 20 x 2 (each walk's singleton and nu(N) again), ours uncached 2 + 20 singletons
    assert result.n_evals == 4
    assert uncached.rows == 22


def test_a_sweep_the_budget_cuts_short_has_a_random_leader() -> None:
    # Execute: room for the ends and one walk
    outcomes = {tuple(np.round(estimate("gtg-greedyfed", TWO, 2, budget=3, seed=s).values, 12))
                for s in range(20)}
    # Assert: after one permutation, led by 0: (0.5, 0.1); led by 1: (0.3, 0.3)
    assert outcomes == {(0.5, 0.1), (0.3, 0.3)}


def test_within_round_truncation_credits_the_leader_only() -> None:
    # Execute
    result = estimate("gtg-greedyfed", FLAT_THREE, 3, budget=60, seed=1)
    values, permutations = gtg_run(CachedGame(FLAT_THREE, 3, 60), np.random.default_rng(1))
    uncached = Uncached(FLAT_THREE)
    gtg_run(uncached, np.random.default_rng(1))  # type: ignore[arg-type]
    # Assert: 7 sweeps of 3 (the first history of >= 20 entries), each client leads 7 of 21
    assert permutations == 21
    np.testing.assert_allclose(result.values, [0.59995 / 3] * 3, atol=1e-12)
    np.testing.assert_allclose(values, [0.199983333] * 3, atol=1e-9)
    # the reference's 2 + 21 evaluations (each walk's first prefix only); 2 + 3 distinct here
    assert uncached.rows == 23
    assert result.n_evals == 5


def test_between_round_truncation_values_nothing() -> None:
    # Prepare: the model moved by 5e-5 < eps = 1e-4; inner coalitions arbitrary
    game = TableGame(np.array([0.60000, 0.9, 0.1, 0.2, 0.7, 0.3, 0.8, 0.60005]))
    # Execute
    result = estimate("gtg-greedyfed", game, 3, budget=60, seed=0)
    _, permutations = gtg_run(CachedGame(game, 3, 60), np.random.default_rng(0))
    # Assert: the reference's [1e-9] * M, after the two end evaluations only
    np.testing.assert_array_equal(result.values, [TRUNCATED] * 3)
    assert (result.n_evals, permutations) == (2, 0)
    moved = TableGame(np.array([0.60000, 0.9, 0.1, 0.2, 0.7, 0.3, 0.8, 0.60020]))
    assert estimate("gtg-greedyfed", moved, 3, budget=60, seed=0).n_evals > 2


def test_the_permutation_cap_binds_when_the_history_is_never_long_enough() -> None:
    # Execute: cap 2 per player, a window the history never reaches
    values, permutations = gtg_run(CachedGame(TWO, 2, 100), np.random.default_rng(0),
                                   window=1000, cap=2)
    # Assert
    assert permutations == 4
    np.testing.assert_allclose(values, [0.4, 0.2], atol=1e-12)


def test_the_budget_stops_it_before_convergence() -> None:
    # Prepare: 6 players, a random game; room for the ends and two walks of 5 new rows
    game = TableGame(np.random.default_rng(0).normal(size=64))
    # Execute
    values, permutations = gtg_run(CachedGame(game, 6, 12), np.random.default_rng(0))
    # Assert: two permutations of a sweep, each telescoping to the gain
    assert permutations == 2
    gain = game.table[-1] - game.table[0]
    assert values.sum() == pytest.approx(gain, abs=1e-12)


def test_guided_orders_let_every_player_lead_once() -> None:
    # Execute
    orders = guided_orders(np.random.default_rng(0), 5)
    # Assert
    assert sorted(orders[:, 0].tolist()) == [0, 1, 2, 3, 4]
    assert all(sorted(row.tolist()) == [0, 1, 2, 3, 4] for row in orders)


def test_convergence_test_by_hand() -> None:
    # Assert: 19 entries are too few; 20 equal ones pass; the last 10 entries' mean distance
    # from the last is compared with 1% of the last; a last value of 0 never passes
    assert not converged([0.0] + [0.3] * 18)
    assert converged([0.0] + [0.3] * 19)
    # the last 10: one 0.3, five 0.3 (1 + d), four 0.3: mean distance d / 2 of the last
    assert not converged([0.0] + [0.3] * 10 + [0.3 * 1.03] * 5 + [0.3] * 4)
    assert converged([0.0] + [0.3] * 10 + [0.3 * 1.01] * 5 + [0.3] * 4)
    assert not converged([0.0] * 25)


@pytest.mark.parametrize(("params", "match"), [
    ({"eps": -1.0}, "eps must be >= 0"), ({"tol": 0.0}, "tol must be > 0"),
    ({"window": 1}, "window must be >= 2"), ({"cap": 0}, "cap must be >= 1")])
def test_bad_parameters_are_clear_errors(params: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        estimate("gtg-greedyfed", TWO, 2, budget=10, seed=0, **params)
