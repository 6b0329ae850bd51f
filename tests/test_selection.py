"""Algorithm 2: epsilon-greedy bandit selection (the ``adaptive`` selector), and the link
groups every selector shares (:mod:`fedowen_strategy.selectors.shared`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedowen_strategy.defences.links import count_links, lasting_groups
from fedowen_strategy.selectors.adaptive import (
    Adaptive,
    AdaptiveSettings,
    select_clients,
    selection_probabilities,
    selection_scores,
    unvalued_floor,
)
from fedowen_strategy.selectors.base import Seen
from fedowen_strategy.selectors.shared import Selection, SelectionParams, select_uniform


def test_scores_match_hand_computation() -> None:
    # Prepare: t = 3 -> ln 4; client 1 sits below tau, so gain 0 and bonus x 0.1
    params = AdaptiveSettings(epsilon=0.0, c=0.5, tau=0.05)
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
    params = AdaptiveSettings(epsilon=0.0, c=0.01, tau=0.0)
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
    params = AdaptiveSettings(epsilon=1.0)
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
    params = AdaptiveSettings(epsilon=0.0, c=1.0, tau=0.0)
    s = selection_scores(np.zeros(3), np.array([0, 4, 99]), 10, params)
    assert s[0] > s[1] > s[2]


def test_tau_floor_penalises_low_contributors() -> None:
    # Prepare: equal counts, client 1 just below tau, client 0 just above
    params = AdaptiveSettings(epsilon=0.0, c=1.0, tau=0.1)
    s = selection_scores(np.array([0.1, 0.0999]), np.array([2, 2]), 4, params)
    bonus = np.sqrt(np.log(5) / 3)
    np.testing.assert_allclose(s, [0.1 + bonus, 0.1 * bonus])


def test_a_positive_floor_spares_clients_not_yet_valued_and_catches_null_players() -> None:
    # Prepare: client 0 never valued (phi 0, count 0), client 1 valued at exactly 0 twice
    # (a free rider in the delta game), client 2 valued at 0.2 twice; t = 4 -> ln 5
    params = AdaptiveSettings(epsilon=0.0, c=1.0, tau=0.01)
    # Execute
    s = selection_scores(np.array([0.0, 0.0, 0.2]), np.array([0, 2, 2]), 4, params)
    # Assert: the unexplored client keeps its whole bonus, the null player keeps a tenth
    ln5 = np.log(5.0)
    np.testing.assert_allclose(s, [np.sqrt(ln5 / 1), 0.1 * np.sqrt(ln5 / 3),
                                   0.2 + np.sqrt(ln5 / 3)], rtol=1e-12)


def test_selection_is_seeded_and_distinct() -> None:
    params = AdaptiveSettings(epsilon=0.3)
    phi = np.linspace(-0.1, 0.4, 20)
    counts = np.arange(20)
    a = [select_clients(phi, counts, t, 5, params, np.random.default_rng(7))[0] for t in (1, 2)]
    b = [select_clients(phi, counts, t, 5, params, np.random.default_rng(7))[0] for t in (1, 2)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
        assert len(set(x.tolist())) == 5


def test_top_up_when_fewer_positive_probabilities_than_k() -> None:
    # Only one client has a score above the minimum; k = 3 still returns 3 distinct clients
    params = AdaptiveSettings(epsilon=0.0, c=0.0, tau=0.0)
    chosen, _ = select_clients(np.array([0.0, 0.0, 0.5, 0.0]), np.zeros(4, np.int64), 1, 3,
                               params, np.random.default_rng(0))
    assert 2 in chosen and len(set(chosen.tolist())) == 3


@pytest.mark.parametrize("kwargs", [{"epsilon": 1.5}, {"c": -1.0}, {"tau": float("nan")},
                                    {"low_gain_scale": 2.0}])
def test_bad_params_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        AdaptiveSettings(**kwargs)


def test_bad_k_is_refused() -> None:
    with pytest.raises(ValueError, match="k=4"):
        select_uniform(3, 4, np.random.default_rng(0))


def test_a_client_never_valued_keeps_a_chance_when_it_holds_the_minimum() -> None:
    # Prepare: 8 clients, 4 valued once above the floor, 4 never valued (round 2)
    params = AdaptiveSettings(epsilon=0.0, c=0.1, tau=0.01)
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
    params = AdaptiveSettings(tau=0.01)
    # a valued client below the floor holds the minimum: unvalued clients keep a chance
    phi = np.array([0.5, -0.2, 0.0, 0.0])
    counts = np.array([1, 1, 0, 0])
    scores = selection_scores(phi, counts, 3, params)
    assert unvalued_floor(scores, counts, 3, params) == 0.0
    # all equal (round 1): uniform either way
    equal = selection_scores(np.zeros(5), np.zeros(5, dtype=int), 1, params)
    assert unvalued_floor(equal, np.zeros(5, dtype=int), 1, params) == 0.0


def adaptive_selection(settings: AdaptiveSettings, params: SelectionParams,
                       rng: np.random.Generator) -> Selection:
    """A run's selection by the adaptive selector, no identity cap."""
    return Selection("adaptive", Adaptive(settings), settings, params, 0.0, rng)


def observe(selection: Selection, clients: list[str], phi: list[float]) -> None:
    selection.observe(Seen(1, tuple(clients), np.asarray(phi, dtype=np.float64)))


def sybil_bandit(link_memory: int) -> tuple[Selection, list[str], list[str]]:
    """100 clients: 20 Sybil identities carrying one useful update (phi 0.12 each, valued
    once), linked four at a time in five rounds (the first pair once more); an honest client
    ``top`` as useful, valued four times (so a group of four has its phi and its count); 79
    others with phi spread over [0, 0.1], valued once."""
    sybils = [f"s{i:02d}" for i in range(20)]
    honest = ["top"] + [f"h{i:02d}" for i in range(79)]
    bandit = adaptive_selection(AdaptiveSettings(epsilon=0.1),
                                SelectionParams(link_memory=link_memory),
                                np.random.default_rng(0))
    spread = np.random.default_rng(1).uniform(0.0, 0.1, 79)
    observe(bandit, sybils + honest, [0.12] * 21 + spread.tolist())
    observe(bandit, ["top"] * 3, [0.12] * 3)
    for first in range(0, 20, 4):
        bandit.observe(Seen(1, (), None), [sybils[first:first + 4]])
    bandit.observe(Seen(1, (), None), [sybils[:2]])
    return bandit, sybils, honest


def test_lasting_links_make_k_sybil_identities_one_arm_of_the_bandit() -> None:
    # Prepare: the same history without and with link memory; a group of four copies has
    # the phi of ``top`` and, summed, as many valuations
    rounds = 3000
    freq: dict[int, tuple[float, float, int]] = {}
    for memory in (0, 1):
        bandit, sybils, honest = sybil_bandit(memory)
        keys = sybils + honest
        group_hits, top_hits, most = 0, 0, 0
        # Execute
        for _ in range(rounds):
            chosen = {keys[i] for i in bandit.choose(keys, 50, 10).indices}
            in_group = len(chosen & set(sybils[:4]))
            group_hits += in_group > 0
            top_hits += "top" in chosen
            most = max(most, in_group)
        freq[memory] = (group_hits / rounds, top_hits / rounds, most)
    # Assert: without memory four identities are drawn far more often than the one honest
    # client of equal worth, often together; with the links lasting, the group is one arm:
    # never two of it in a round, and drawn about as often as ``top``
    assert freq[0][0] > 2 * freq[0][1] and freq[0][2] >= 2
    assert freq[1][2] == 1
    assert abs(freq[1][0] - freq[1][1]) < 0.03
    # link-memory 2: only the pair linked in two rounds shares an arm
    bandit, sybils, honest = sybil_bandit(2)
    arms = bandit.arms(sybils + honest)
    assert arms is not None and arms[0] == arms[1]
    assert len(set(arms.tolist())) == 99


def test_link_memory_survives_a_checkpoint_and_is_off_by_default() -> None:
    bandit, sybils, honest = sybil_bandit(1)
    restored = adaptive_selection(AdaptiveSettings(epsilon=0.1), SelectionParams(link_memory=1),
                                  np.random.default_rng(5))
    restored.load(json.loads(json.dumps(bandit.state())))
    keys = sybils + honest
    np.testing.assert_array_equal(restored.arms(keys), bandit.arms(keys))
    np.testing.assert_array_equal(restored.choose(keys, 3, 10).indices,
                                  bandit.choose(keys, 3, 10).indices)
    off, _, _ = sybil_bandit(0)
    assert off.pair_links == {} and off.arms(keys) is None
    with pytest.raises(ValueError, match="link_memory=-1 must be >= 0"):
        SelectionParams(link_memory=-1)


def test_lasting_groups_join_pairs_linked_often_enough() -> None:
    # Prepare: a-b linked in 3 rounds, b-c in 1, d-e in 2
    pairs = count_links({}, [["b", "a"], ["d", "e"]])
    pairs = count_links(pairs, [["a", "b", "c"], ["e", "d"]])
    pairs = count_links(pairs, [["a", "b"]])
    # Assert: hand-counted; c joins at 1, not at 2
    assert pairs == {("a", "b"): 3, ("a", "c"): 1, ("b", "c"): 1, ("d", "e"): 2}
    assert lasting_groups(pairs, 1) == [["a", "b", "c"], ["d", "e"]]
    assert lasting_groups(pairs, 2) == [["a", "b"], ["d", "e"]]
    assert lasting_groups(pairs, 3) == [["a", "b"]]
    assert lasting_groups(pairs, 0) == []
