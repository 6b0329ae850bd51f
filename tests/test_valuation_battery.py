"""Common checks run over every registered valuation method (sklearn-style battery)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedowen_strategy.valuation import ESTIMATORS, Valuation, estimate
from fedowen_strategy.valuation.games import AdditiveGame, TableGame
from tests.stats import t_critical

METHODS = sorted(ESTIMATORS)
# Methods whose null player gets 0 only in expectation (estimates from coalition values, not
# from marginals): every other method credits a null player exactly 0.
NULL_IN_EXPECTATION = ("banzhaf", "svarm", "kernel-shap", "leverage-shap", "kadd-shap")
REGRESSIONS = ("kernel-shap", "leverage-shap", "kadd-shap")
N = 6
N_SEEDS = 20
# Statistical checks in this file: null player + symmetry, per method. Bonferroni keeps the
# family-wise false-alarm rate below 1%.
N_STAT_CHECKS = 2 * len(METHODS)


T_CRIT = t_critical(0.01 / N_STAT_CHECKS, N_SEEDS - 1)


def structured_game() -> AdditiveGame:
    """n = 6: player 0 is null, players 1 and 2 are symmetric, everyone else interacts."""
    weights = np.array([0.0, 1.0, 1.0, 2.0, 0.5, 3.0])
    pairs = np.zeros((N, N))
    pairs[1, 2] = -0.7
    pairs[1, 3] = pairs[2, 3] = 0.4
    pairs[1, 5] = pairs[2, 5] = -0.3
    pairs[3, 4] = 1.1
    pairs[4, 5] = -0.5
    return AdditiveGame(weights, pairs, offset=0.25)


class RowRecorder:
    """``game`` that appends every coalition row it is asked for to ``rows`` (packed bytes);
    its first-order terms are the game's."""

    def __init__(self, game: AdditiveGame, rows: list[bytes]) -> None:
        self.game, self.rows = game, rows

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        self.rows.extend(r.tobytes() for r in np.packbits(masks, axis=1))
        return self.game(masks)

    def first_order(self, at: float) -> np.ndarray:
        return self.game.first_order(at)


def budget_for(method: str, n: int = N) -> int:
    return 1 << n if method == "exact" else 8 * n


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("budget_factor", [1, 3, 8])
def test_budget_is_respected_and_counted(method: str, budget_factor: int) -> None:
    # Prepare
    rows: list[bytes] = []
    game = structured_game()
    utility = RowRecorder(game, rows)
    spec = ESTIMATORS[method]
    budget = max(spec.min_budget(N), budget_factor * N)
    # Execute
    result = estimate(method, utility, N, budget=budget, seed=1)
    # Assert
    assert isinstance(result, Valuation)
    assert result.method == method
    assert result.values.shape == (N,)
    assert result.n_evals == len(rows) <= budget
    assert len(set(rows)) == len(rows), "a coalition was evaluated twice"


@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_values(method: str) -> None:
    # Prepare
    game = structured_game()
    budget = budget_for(method)
    # Execute
    a = estimate(method, game, N, budget=budget, seed=7)
    b = estimate(method, game, N, budget=budget, seed=7)
    c = estimate(method, game, N, budget=budget, seed=np.random.default_rng(7))
    # Assert
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.values, c.values)
    assert a.n_evals == b.n_evals


def _values_over_seeds(method: str) -> np.ndarray:
    game = structured_game()
    budget = budget_for(method)
    return np.array(
        [estimate(method, game, N, budget=budget, seed=s).values for s in range(N_SEEDS)]
    )


def _mean_is_zero(samples: np.ndarray) -> bool:
    sd = samples.std(ddof=1)
    if sd < 1e-12:
        return bool(abs(samples.mean()) < 1e-9)
    return bool(abs(samples.mean()) <= T_CRIT * sd / math.sqrt(len(samples)))


@pytest.mark.parametrize("method", METHODS)
def test_null_player_gets_zero(method: str) -> None:
    # Prepare / Execute
    values = _values_over_seeds(method)
    # Assert: exactly 0 for estimators built from marginals; 0 in expectation for the others
    if method in NULL_IN_EXPECTATION:
        assert _mean_is_zero(values[:, 0])
    else:
        np.testing.assert_allclose(values[:, 0], 0.0, atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_symmetric_players_equal_in_expectation(method: str) -> None:
    # Prepare / Execute
    values = _values_over_seeds(method)
    # Assert
    assert _mean_is_zero(values[:, 1] - values[:, 2])


@pytest.mark.parametrize(
    ("method", "params"),
    [("exact", {}), ("owen", {}), ("owen", {"sampler": "flip"}), ("owen-antithetic", {}),
     ("mc-shapley", {}), ("first-order", {}), ("first-order", {"at": 0.0}),
     ("first-order-refined", {}), ("first-order-simpson", {}),
     *((m, {}) for m in REGRESSIONS)],
)
def test_additive_game_is_recovered_exactly(method: str, params: dict[str, object]) -> None:
    # Prepare
    weights = np.array([0.3, -1.2, 2.0, 0.0, 5.5, 0.7, 1.1])
    game = AdditiveGame(weights, offset=2.0)
    n = len(weights)
    budget = 1 << n if method == "exact" else 4 * n
    # Execute
    result = estimate(method, game, n, budget=budget, seed=3, **params)
    # Assert
    np.testing.assert_allclose(result.values, weights, atol=1e-9)


@pytest.mark.parametrize("method", ["kadd-shap", "kernel-shap", "owen-antithetic",
                                    "first-order", "first-order-refined",
                                    "first-order-simpson"])
def test_pairwise_game_is_recovered_exactly(method: str) -> None:
    # Prepare: kADD-SHAP fits a 2-additive game, so any game with pairwise interactions is
    # recovered once the fit is determined; paired KernelSHAP is exact for such games too, an
    # antithetic walk pair averages j's pair terms to their halves, and the first-order term
    # at the midpoint of a quadratic extension is its Shapley value (so is Simpson's rule over
    # the terms at 0, 1/2 and 1, first-order-refined's cheap value)
    game = structured_game()
    # Execute
    result = estimate(method, game, N, budget=40, seed=4)
    # Assert
    np.testing.assert_allclose(result.values, game.shapley_values(), atol=1e-9)


def test_first_order_terms_are_counted_outside_the_budget() -> None:
    # Prepare
    game = structured_game()
    # Execute
    fo = estimate("first-order", game, N, budget=2, seed=0, at=0.0)
    walks = estimate("owen", game, N, budget=40, seed=0)
    # Assert: the ends are evaluated, the gradient counted apart; no other method takes one
    assert (fo.n_evals, fo.n_gradients) == (2, 1)
    np.testing.assert_allclose(fo.values, game.first_order(0.0))
    assert walks.n_gradients == 0


def test_first_order_refuses_a_utility_without_first_order_terms() -> None:
    with pytest.raises(ValueError, match="has no first_order"):
        estimate("first-order", lambda m: m.sum(axis=1).astype(float), N, budget=10, seed=0)


def test_first_order_of_a_table_game_names_the_recorded_points() -> None:
    game = TableGame(np.arange(4.0), first_order={0.5: np.array([1.0, 2.0])})
    assert estimate("first-order", game, 2, budget=2, seed=0).values.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"no first-order terms recorded at 0.0.*\[0.5\]"):
        estimate("first-order", game, 2, budget=2, seed=0, at=0.0)


def brute_force_shapley(game: TableGame) -> np.ndarray:
    """Average marginal contribution over all n! orders, written independently of the library."""
    n = game.n_players
    total = np.zeros(n)
    for order in itertools.permutations(range(n)):
        mask = np.zeros((1, n), dtype=bool)
        prev = float(game(mask)[0])
        for j in order:
            mask[0, j] = True
            cur = float(game(mask)[0])
            total[j] += cur - prev
            prev = cur
    return total / math.factorial(n)


@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_exact_matches_brute_force_permutations(n: int) -> None:
    # Prepare
    rng = np.random.default_rng(n)
    game = TableGame(rng.normal(size=1 << n))
    # Execute
    result = estimate("exact", game, n, budget=1 << n, seed=0)
    # Assert
    np.testing.assert_allclose(result.values, brute_force_shapley(game), atol=1e-12)
    assert result.n_evals == 1 << n


def test_exact_refuses_more_than_20_players() -> None:
    with pytest.raises(ValueError, match=r"refuses n_players=21 > 20"):
        estimate("exact", lambda m: np.zeros(len(m)), 21, budget=1 << 22, seed=0)


def test_unknown_method_lists_valid_methods() -> None:
    with pytest.raises(ValueError, match=r"unknown method 'shapley'.*owen-paper.*weighted-shap"):
        estimate("shapley", structured_game(), N, budget=50, seed=0)


def test_unknown_parameter_lists_valid_parameters() -> None:
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['M'\].*sampler="):
        estimate("owen", structured_game(), N, budget=50, seed=0, M=4)


@pytest.mark.parametrize("method", METHODS)
def test_too_small_budget_is_a_clear_error(method: str) -> None:
    need = ESTIMATORS[method].min_budget(N)
    with pytest.raises(ValueError, match=rf"budget={need - 1} is too small .* at least {need}"):
        estimate(method, structured_game(), N, budget=need - 1, seed=0)


@pytest.mark.parametrize(
    ("method", "params", "match"),
    [
        ("owen", {"sampler": "kernel"}, "sampler must be one of"),
        ("owen", {"eta": 1.5}, "eta must be in"),
        ("owen", {"sampler": "flip", "eta": 0.1}, "sampler='walk' only"),
        ("owen-paper", {"levels": 0}, "levels"),
        ("gtg-shapley", {"eps": -1.0}, "eps must be"),
        ("gtg-greedyfed", {"eps": -1.0}, "eps must be"),
        ("weighted-shap", {"alpha": 0.0}, "alpha and beta"),
        ("svarm", {"proposal": "cubic"}, "proposal must be one of"),
        ("kernel-shap", {"proposal": "cubic"}, "proposal must be one of"),
        ("kadd-shap", {"ridge": -1.0}, "ridge must be"),
        ("first-order", {"at": 1.5}, "at=1.5 must lie in"),
        ("owen-antithetic", {"eta": 1.5}, "eta must be in"),
    ],
)
def test_bad_parameter_values_are_clear_errors(
    method: str, params: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        estimate(method, structured_game(), N, budget=60, seed=0, **params)


def test_bad_utility_output_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="one float per row"):
        estimate("mc-shapley", lambda m: np.zeros((len(m), 2)), N, budget=60, seed=0)


def test_seed_must_be_int_or_generator() -> None:
    with pytest.raises(ValueError, match="seed must be"):
        estimate("owen", structured_game(), N, budget=60, seed=None)  # type: ignore[arg-type]


def test_registered_names_are_exactly_the_contract() -> None:
    assert set(ESTIMATORS) == {
        "exact", "owen", "owen-antithetic", "owen-paper", "mc-shapley", "gtg-shapley",
        "gtg-greedyfed", "banzhaf", "weighted-shap", "loo", "svarm", "kernel-shap",
        "leverage-shap", "kadd-shap", "first-order", "first-order-refined",
        "first-order-simpson",
    }
    assert [m for m, spec in ESTIMATORS.items() if spec.uses_first_order] == [
        "first-order", "first-order-refined", "first-order-simpson"]


def test_efficient_methods_sum_to_total_gain() -> None:
    # Prepare
    game = structured_game()
    gain = float(game(np.ones((1, N), dtype=bool))[0] - game(np.zeros((1, N), dtype=bool))[0])
    # Execute / Assert: every walk telescopes, so single estimates are exactly efficient
    for method in ("exact", "owen", "owen-antithetic", "mc-shapley", *REGRESSIONS):
        result = estimate(method, game, N, budget=budget_for(method), seed=5)
        assert result.values.sum() == pytest.approx(gain, abs=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_end_points_are_recorded_within_the_budget(method: str) -> None:
    # Prepare: a utility that records every row it is asked for
    rows: list[bytes] = []
    game = structured_game()
    utility = RowRecorder(game, rows)

    ends = np.array([np.zeros(N, bool), np.ones(N, bool)])
    budget = ESTIMATORS[method].min_budget(N)
    # Execute: at the smallest budget the method accepts
    result = estimate(method, utility, N, budget=budget, seed=2)
    # Assert: nu(empty) and nu(N) are the game's, evaluated once each and counted
    assert (result.v_empty, result.v_grand) == tuple(game(ends))
    for row in np.packbits(ends, axis=1):
        assert rows.count(row.tobytes()) == 1
    assert result.n_evals == len(rows) <= budget


def test_owen_paper_guards_a_zero_total_gain() -> None:
    # Prepare: nu(N) == nu(empty) but inner coalitions differ
    game = TableGame(np.array([0.5, 0.9, 0.2, 0.5]))
    # Execute
    result = estimate("owen-paper", game, 2, budget=20, seed=0)
    # Assert: finite values in raw units (nothing divided by the zero gain)
    assert result.v_grand == result.v_empty
    assert np.all(np.isfinite(result.values))
    assert np.abs(result.values).max() <= 0.9
