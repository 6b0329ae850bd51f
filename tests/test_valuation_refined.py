"""``first-order-refined``: which players it refines, what it spends, what it keeps exact.

The games are hand-built: an additive table (every marginal of player j is its weight a_j)
whose recorded first-order terms are chosen, independently of the table, so that Simpson's
values ``s`` and the bands ``h`` are known by hand:
``c(0) = c(1) = s + x`` and ``c(1/2) = s - x / 2`` give Simpson ``(c(0) + 4 c(1/2) + c(1)) / 6 = s``
and ``h = band * |c(0) - 2 c(1/2) + c(1)| / 6 = band * |x| / 2``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.valuation import estimate
from fedowen_strategy.valuation.exact import all_coalitions
from fedowen_strategy.valuation.games import AdditiveGame, TableGame

WEIGHTS = np.array([1.0, 2.0, 2.1, 5.0])  # the true (Shapley) values: the table is additive
SIMPSON = np.array([1.5, 2.05, 2.2, 4.0])


def game_with_terms(x: np.ndarray) -> TableGame:
    """The additive table of WEIGHTS with first-order terms giving Simpson = SIMPSON and
    half-widths ``band * |x| / 2``."""
    n = len(WEIGHTS)
    table = AdditiveGame(WEIGHTS)(all_coalitions(n, 0, 1 << n))
    edge, middle = SIMPSON + x, SIMPSON - x / 2
    return TableGame(table, first_order={0.0: edge, 0.5: middle, 1.0: edge})


def test_only_players_with_overlapping_bands_are_refined() -> None:
    # Prepare: h = [0, .2, .2, 0]; |s1 - s2| = .15 < .4, so 1 and 2 overlap; player 0 is .55
    # from player 1 (> 0 + .2) and player 3 is 1.8 from player 2: both settled
    game = game_with_terms(np.array([0.0, 0.4, 0.4, 0.0]))
    # Execute: 2 refined players cost at most min(4, 3) = 3 rows a walk, 6 a pair, 12 for two
    result = estimate("first-order-refined", game, 4, budget=2 + 12, seed=0, band=1.0, pairs=2)
    # Assert: the refined players get their marginals (exact here), the settled ones Simpson
    np.testing.assert_allclose(result.values, [1.5, 2.0, 2.1, 4.0], atol=1e-12)
    assert result.n_gradients == 3
    assert 2 < result.n_evals <= 14


def test_a_tight_budget_refines_the_widest_band_first() -> None:
    # Prepare: h = [0, .2, .3, 0]: players 1 and 2 unsettled, player 2's band the wider
    game = game_with_terms(np.array([0.0, 0.4, 0.6, 0.0]))
    # Execute: 8 rows after the ends, 4 a pair for 2 pairs: two players' pair needs
    # 2 x min(4, 3) = 6 > 4, one player's 2 x min(2, 3) = 4
    result = estimate("first-order-refined", game, 4, budget=2 + 8, seed=1, band=1.0, pairs=2)
    # Assert
    np.testing.assert_allclose(result.values, [1.5, 2.05, 2.1, 4.0], atol=1e-12)
    assert result.n_evals <= 10


def test_a_budget_that_fits_no_pair_gives_simpsons_values() -> None:
    # Prepare
    game = game_with_terms(np.array([0.0, 0.4, 0.4, 0.0]))
    # Execute: 3 rows after the ends, less than the 4 one player's pair may need
    result = estimate("first-order-refined", game, 4, budget=5, seed=0, band=1.0, pairs=1)
    # Assert
    np.testing.assert_allclose(result.values, SIMPSON, atol=1e-12)
    assert result.n_evals == 2


def test_band_zero_refines_nobody() -> None:
    # Prepare
    game = game_with_terms(np.array([0.0, 0.4, 0.4, 0.0]))
    # Execute
    result = estimate("first-order-refined", game, 4, budget=40, seed=0, band=0.0)
    # Assert
    np.testing.assert_allclose(result.values, SIMPSON, atol=1e-12)
    assert (result.n_evals, result.n_gradients) == (2, 3)


def test_simpson_is_band_zero_under_its_own_name() -> None:
    # Prepare: overlapping bands, which first-order-refined at band 1 would refine
    game = game_with_terms(np.array([0.0, 0.4, 0.4, 0.0]))
    # Execute
    result = estimate("first-order-simpson", game, 4, budget=40, seed=0)
    # Assert: Simpson's values, the ends and three gradients only, the same for any seed
    np.testing.assert_allclose(result.values, SIMPSON, atol=1e-12)
    assert (result.n_evals, result.n_gradients) == (2, 3)
    again = estimate("first-order-simpson", game_with_terms(np.array([0.0, 0.4, 0.4, 0.0])),
                     4, budget=40, seed=7)
    np.testing.assert_array_equal(again.values, result.values)


def test_a_refined_null_player_gets_exactly_zero() -> None:
    # Prepare: player 0 is null (the table ignores bit 0) and its terms are 0; player 1's band
    # (h = 1 * .3 / 2 = .15) covers 0, so player 0 is unsettled and refined; the rest of the
    # table is not additive, so the other marginals vary with the coalition
    rng = np.random.default_rng(0)
    codes = np.arange(8)
    table = rng.normal(size=4)[codes >> 1]
    s, x = np.array([0.0, 0.01, 3.0]), np.array([0.0, 0.3, 0.0])
    game = TableGame(table, first_order={0.0: s + x, 0.5: s - x / 2, 1.0: s + x})
    # Execute
    result = estimate("first-order-refined", game, 3, budget=30, seed=2, band=1.0, pairs=2)
    # Assert
    assert result.values[0] == 0.0
    assert result.n_evals > 2  # walks ran


@pytest.mark.parametrize(("params", "message"), [
    ({"band": -1.0}, r"band=-1.0 must be a finite number >= 0"),
    ({"band": float("nan")}, r"band=nan must be a finite number >= 0"),
    ({"pairs": 0}, r"pairs=0 must be an int >= 1"),
])
def test_bad_parameters_are_named(params: dict[str, float], message: str) -> None:
    game = game_with_terms(np.zeros(4))
    with pytest.raises(ValueError, match=message):
        estimate("first-order-refined", game, 4, budget=20, seed=0, **params)
