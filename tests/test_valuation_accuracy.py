"""Accuracy of the estimators on games with known exact values, at budgets N x M.

Asserts that ``owen`` and ``owen-antithetic`` are unbiased (a per-player t-test over fixed seeds,
Bonferroni-corrected so the false-alarm rate of all checks together is below 1%), that the same
test has the power to flag the biased ``owen-paper``, and states the bias of ``first-order`` on a
recorded round. MSE against ``exact`` is reported (run with ``-s``), not asserted;
the full table lives in docs/valuation.md (benchmarks/bench_valuation.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedowen_strategy.valuation import ESTIMATORS, estimate
from fedowen_strategy.valuation.games import TableGame, interaction_game, voting_game
from tests.stats import t_critical

FL_GAME = Path(__file__).parent / "data" / "fl_game_mnist_lenet_n10.json"
# A round as the app plays it (delta game, neg-loss; benchmarks/record_app_games.py), from the
# battery's development half: an early round, far from quadratic
APP_GAME = Path(__file__).parent / "data" / "games" / "mnist_a0.1_r03_s1.json.gz"
GAMES: dict[str, Any] = {
    "interaction": interaction_game(),
    "voting": voting_game(),
    "fl-mnist": TableGame.from_json(FL_GAME),
    "app-mnist": TableGame.from_json(APP_GAME),
}
MS = (4, 10, 40)
# svarm claims unbiasedness once its covering warm-up fits (n = 10: 62 evaluations, M >= 7)
SVARM_MS = (10, 40)
# first-order (midpoint) on the app game: its largest error, relative to the largest |phi|, is
# 9.7% (not 0: the round's loss is not quadratic in the updates), its ranking exact
FIRST_ORDER_ERROR = (0.05, 0.15)
FIRST_ORDER_MIN_SPEARMAN = 0.95
N_SEEDS = 100
# players x games x budgets (all games have n = 10), for owen, owen-antithetic and svarm
N_CHECKS = len(GAMES) * (2 * len(MS) + len(SVARM_MS)) * 10


T_CRIT = t_critical(0.01 / N_CHECKS, N_SEEDS - 1)


def exact_values(game: Any, n: int) -> np.ndarray:
    return estimate("exact", game, n, budget=1 << n, seed=0).values


def runs(method: str, game_name: str, m: int, n_seeds: int = N_SEEDS) -> np.ndarray:
    game = GAMES[game_name]
    n = game.n_players
    return np.array(
        [estimate(method, game, n, budget=n * m, seed=s).values for s in range(n_seeds)]
    )


def bias_flags(samples: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Players whose mean over seeds is further than T_CRIT standard errors from the truth."""
    mean = samples.mean(axis=0)
    se = samples.std(axis=0, ddof=1) / math.sqrt(len(samples))
    deterministic = se < 1e-12
    return np.where(deterministic, np.abs(mean - truth) > 1e-9, np.abs(mean - truth) > T_CRIT * se)


@pytest.mark.parametrize("game_name", list(GAMES))
@pytest.mark.parametrize(("method", "m"), [
    *[("owen", m) for m in MS], *[("owen-antithetic", m) for m in MS],
    *[("svarm", m) for m in SVARM_MS]])  # svarm: once its warm-up fits
def test_sampling_estimators_are_unbiased(method: str, m: int, game_name: str) -> None:
    # Prepare
    game = GAMES[game_name]
    truth = exact_values(game, game.n_players)
    # Execute
    samples = runs(method, game_name, m)
    # Assert
    flagged = bias_flags(samples, truth)
    assert not flagged.any(), (
        f"{method} mean {samples.mean(axis=0)[flagged]} vs exact {truth[flagged]} "
        f"(players {np.flatnonzero(flagged)})"
    )


def test_owen_antithetic_is_exact_on_a_pairwise_game() -> None:
    # Prepare: the interaction game has only pairwise terms, which every antithetic pair
    # averages to their Shapley halves
    truth = exact_values(GAMES["interaction"], 10)
    # Execute
    samples = runs("owen-antithetic", "interaction", 4, n_seeds=10)
    # Assert
    np.testing.assert_allclose(samples, np.tile(truth, (10, 1)), atol=1e-12)


def test_first_order_on_a_recorded_game_states_its_bias() -> None:
    # Prepare: the recorded terms at the midpoint; an early round, far from quadratic
    game = GAMES["app-mnist"]
    truth = exact_values(game, 10)
    # Execute
    result = estimate("first-order", game, 10, budget=20, seed=0)
    # Assert: the recorded terms, deterministic, biased by a known amount (the table's own
    # cubic and higher terms), which the ranking survives
    np.testing.assert_array_equal(result.values, game.first_order(0.5))
    assert (result.n_evals, result.n_gradients) == (2, 1)
    error = np.abs(result.values - truth).max() / np.abs(truth).max()
    assert FIRST_ORDER_ERROR[0] <= error <= FIRST_ORDER_ERROR[1]
    assert np.corrcoef(np.argsort(np.argsort(result.values)),
                       np.argsort(np.argsort(truth)))[0, 1] >= FIRST_ORDER_MIN_SPEARMAN


def test_a_linearised_control_variate_changes_nothing() -> None:
    # Prepare: the recorded game minus its linearisation (Shapley values c, known exactly)
    game = GAMES["app-mnist"]
    c = game.first_order(0.5)
    codes = np.arange(1 << 10)
    residual = TableGame(game.table - ((codes[:, None] >> np.arange(10)) & 1) @ c)
    # Execute / Assert: owen's marginals shift by constants, so the control variate is a no-op
    # (why owen-antithetic, not a linear control variate; fedowen_strategy.valuation.owen)
    for seed in range(5):
        plain = estimate("owen", game, 10, budget=40, seed=seed).values
        with_cv = c + estimate("owen", residual, 10, budget=40, seed=seed).values
        np.testing.assert_allclose(with_cv, plain, atol=1e-15)


def test_the_bias_test_has_power_against_owen_paper() -> None:
    # Prepare: the paper's fixed grid q = 1/2, 1 is biased; the same test must see it
    game = GAMES["interaction"]
    truth = exact_values(game, game.n_players)
    # Execute
    samples = runs("owen-paper", "interaction", 10)
    # Assert
    assert bias_flags(samples, truth).any()


def test_report_mse_table(capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    # first-order needs recorded terms, which only the app game has (measured in
    # benchmarks/bench_ranking_battery.py)
    methods = [m for m, spec in ESTIMATORS.items() if m != "exact" and not spec.uses_first_order]
    table: dict[tuple[str, int, str], float] = {}
    # Execute
    for game_name, game in GAMES.items():
        truth = exact_values(game, game.n_players)
        for m in MS:
            for method in methods:
                samples = runs(method, game_name, m, n_seeds=30)
                table[game_name, m, method] = float(np.mean((samples - truth) ** 2))
    # Assert: reported, not asserted, except sanity: finite, and owen improves with budget
    assert all(np.isfinite(v) for v in table.values())
    for game_name in GAMES:
        assert table[game_name, 40, "owen"] < table[game_name, 4, "owen"]
    with capsys.disabled():
        print("\nMSE vs exact over 30 seeds (budget = 10 x M)")
        print(f"{'game':12s} {'M':>3s} " + " ".join(f"{m:>13s}" for m in methods))
        for game_name in GAMES:
            for m in MS:
                row = " ".join(f"{table[game_name, m, meth]:13.3e}" for meth in methods)
                print(f"{game_name:12s} {m:3d} {row}")
