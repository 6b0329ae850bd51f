"""Algorithm 2: epsilon-greedy bandit selection."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.selection import (
    SelectionParams,
    select_clients,
    select_uniform,
    selection_probabilities,
    selection_scores,
    unvalued_floor,
)


def test_scores_match_hand_computation() -> None:
    # Prepare: t = 3 -> ln 4; client 1 sits below tau, so gain 0 and bonus x 0.1
    params = SelectionParams(epsilon=0.0, c=0.5, tau=0.05)
    phi = np.array([0.3, 0.01, 0.05])
    counts = np.array([3, 1, 1])
    # Execute
    s = selection_scores(phi, counts, 3, params)
    # Assert
    ln4 = np.log(4.0)
    expected = [0.3 + 0.5 * np.sqrt(ln4 / 4), 0.1 * 0.5 * np.sqrt(ln4 / 2),
                0.05 + 0.5 * np.sqrt(ln4 / 2)]
    np.testing.assert_allclose(s, expected, rtol=1e-12)


def test_probabilities_shift_by_min_and_fall_back_to_uniform() -> None:
    np.testing.assert_allclose(selection_probabilities(np.array([1.0, 2.0, 4.0])),
                               [0.0, 1 / 4, 3 / 4])
    np.testing.assert_allclose(selection_probabilities(np.array([0.7, 0.7])), [0.5, 0.5])


def test_epsilon_zero_follows_score_order_in_distribution() -> None:
    # Prepare: 6 clients with clearly ordered contributions, each valued once
    params = SelectionParams(epsilon=0.0, c=0.01, tau=0.0)
    phi = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    counts = np.ones(6, dtype=np.int64)
    rng = np.random.default_rng(0)
    # Execute
    hits = np.zeros(6)
    for _ in range(4000):
        chosen, explored = select_clients(phi, counts, 5, 1, params, rng)
        assert not explored
        hits[chosen] += 1
    # Assert: frequencies follow the shifted scores (client 0 has score = min -> never)
    probs = selection_probabilities(selection_scores(phi, counts, 5, params))
    assert hits[0] == 0
    assert np.all(np.diff(hits[1:]) > 0)
    np.testing.assert_allclose(hits / hits.sum(), probs, atol=0.03)


def test_epsilon_one_is_uniform() -> None:
    # Prepare: scores would strongly favour client 0, but epsilon = 1 always explores
    params = SelectionParams(epsilon=1.0)
    phi = np.array([10.0, 0.0, 0.0, 0.0, 0.0])
    rng = np.random.default_rng(1)
    hits = np.zeros(5)
    for _ in range(5000):
        chosen, explored = select_clients(phi, np.zeros(5, np.int64), 2, 2, params, rng)
        assert explored
        hits[chosen] += 1
    # Assert: each client is chosen 2/5 of the time (binomial sd ~ 35 of 2000)
    np.testing.assert_allclose(hits / 5000, 0.4, atol=0.03)


def test_counters_raise_exploration_bonus_of_rarely_selected() -> None:
    params = SelectionParams(epsilon=0.0, c=1.0, tau=0.0)
    s = selection_scores(np.zeros(3), np.array([0, 4, 99]), 10, params)
    assert s[0] > s[1] > s[2]


def test_tau_floor_penalises_low_contributors() -> None:
    # Prepare: equal counts, client 1 just below tau, client 0 just above
    params = SelectionParams(epsilon=0.0, c=1.0, tau=0.1)
    s = selection_scores(np.array([0.1, 0.0999]), np.array([2, 2]), 4, params)
    bonus = np.sqrt(np.log(5) / 3)
    np.testing.assert_allclose(s, [0.1 + bonus, 0.1 * bonus])


def test_a_positive_floor_spares_clients_not_yet_valued_and_catches_null_players() -> None:
    # Prepare: client 0 never valued (phi 0, count 0), client 1 valued at exactly 0 twice
    # (a free rider in the delta game), client 2 valued at 0.2 twice; t = 4 -> ln 5
    params = SelectionParams(epsilon=0.0, c=1.0, tau=0.01)
    # Execute
    s = selection_scores(np.array([0.0, 0.0, 0.2]), np.array([0, 2, 2]), 4, params)
    # Assert: the unexplored client keeps its whole bonus, the null player keeps a tenth
    ln5 = np.log(5.0)
    np.testing.assert_allclose(s, [np.sqrt(ln5 / 1), 0.1 * np.sqrt(ln5 / 3),
                                   0.2 + np.sqrt(ln5 / 3)], rtol=1e-12)


def test_selection_is_seeded_and_distinct() -> None:
    params = SelectionParams(epsilon=0.3)
    phi = np.linspace(-0.1, 0.4, 20)
    counts = np.arange(20)
    a = [select_clients(phi, counts, t, 5, params, np.random.default_rng(7))[0] for t in (1, 2)]
    b = [select_clients(phi, counts, t, 5, params, np.random.default_rng(7))[0] for t in (1, 2)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
        assert len(set(x.tolist())) == 5


def test_top_up_when_fewer_positive_probabilities_than_k() -> None:
    # Only one client has a score above the minimum; k = 3 still returns 3 distinct clients
    params = SelectionParams(epsilon=0.0, c=0.0, tau=0.0)
    chosen, _ = select_clients(np.array([0.0, 0.0, 0.5, 0.0]), np.zeros(4, np.int64), 1, 3,
                               params, np.random.default_rng(0))
    assert 2 in chosen and len(set(chosen.tolist())) == 3


@pytest.mark.parametrize("kwargs", [{"epsilon": 1.5}, {"c": -1.0}, {"tau": float("nan")},
                                    {"low_gain_scale": 2.0}])
def test_bad_params_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SelectionParams(**kwargs)


def test_bad_k_is_refused() -> None:
    with pytest.raises(ValueError, match="k=4"):
        select_uniform(3, 4, np.random.default_rng(0))


def test_a_client_never_valued_keeps_a_chance_when_it_holds_the_minimum() -> None:
    # Prepare: 8 clients, 4 valued once above the floor, 4 never valued (round 2)
    params = SelectionParams(epsilon=0.0, c=0.1, tau=0.01)
    phi = np.array([0.25, 0.25, 0.25, 0.25, 0, 0, 0, 0])
    counts = np.array([1, 1, 1, 1, 0, 0, 0, 0])
    scores = selection_scores(phi, counts, 2, params)
    # Execute
    literal = selection_probabilities(scores)
    floor = unvalued_floor(scores, counts, 2, params)
    fixed = selection_probabilities(scores, floor)
    # Assert: Algorithm 2 as written gives them 0; with the floor, their own bonus's worth
    assert np.all(literal[4:] == 0)
    assert floor == pytest.approx(0.1 * np.sqrt(np.log(3.0)))
    assert np.all(fixed[4:] > 0.05) and fixed.sum() == pytest.approx(1.0)


def test_the_floor_leaves_algorithm_2_alone_otherwise() -> None:
    params = SelectionParams(tau=0.01)
    # a valued client below the floor holds the minimum: unvalued clients keep a chance
    phi = np.array([0.5, -0.2, 0.0, 0.0])
    counts = np.array([1, 1, 0, 0])
    scores = selection_scores(phi, counts, 3, params)
    assert unvalued_floor(scores, counts, 3, params) == 0.0
    # all equal (round 1): uniform either way
    equal = selection_scores(np.zeros(5), np.zeros(5, dtype=int), 1, params)
    assert unvalued_floor(equal, np.zeros(5, dtype=int), 1, params) == 0.0
