"""The field's selectors (Power-of-Choice, Oort), the posterior and screened selectors and the
identity cap (:mod:`fedowen_strategy.selectors`), each through a run's
:class:`~fedowen_strategy.selectors.shared.Selection`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict
from scipy.stats import chisquare, norm

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.round.contribution import ValuationSettings, resolve_auto
from fedowen_strategy.selectors import registry
from fedowen_strategy.selectors.base import Seen, SelectorSettings
from fedowen_strategy.selectors.oort import (
    oort_exploration,
    oort_scores,
    oort_select,
    oort_utility,
)
from fedowen_strategy.selectors.posterior import (
    Posterior,
    PosteriorSettings,
    posterior,
    round_ranks,
)
from fedowen_strategy.selectors.power_of_choice import PowerOfChoiceSettings, keep_highest
from fedowen_strategy.selectors.screened import resolved_harmful
from fedowen_strategy.selectors.shared import Selection, SelectionParams, cap_eligible
from fedowen_task.protocol import LOCAL_LOSS_FIELD, LOSS_SQUARES_FIELD
from tests.test_round_step import delta_game, round_of

KEYS = [str(i) for i in range(100)]


def selection_of(mode: str, seed: int, cap: float = -1.0,
                 settings: SelectorSettings | None = None) -> Selection:
    """A run's selection by ``mode`` (its default settings unless given), the identity cap
    ``cap`` resolved as the strategy resolves it."""
    return registry.selection(mode, settings, SelectionParams(cap=cap),
                              registry.resolve_cap(mode, cap), np.random.default_rng(seed))


def observe(selection: Selection, clients: list[str], phi: np.ndarray, t: int = 1,
            replies: tuple[RecordDict, ...] = ()) -> None:
    selection.observe(Seen(t, tuple(clients), np.asarray(phi, dtype=np.float64), replies))


def test_power_of_choice_keeps_the_k_highest_loss_candidates() -> None:
    # Prepare: hand-built losses of d = 6 candidates, a tie at 0.9 and a failed one (NaN)
    losses = np.array([0.2, 0.9, np.nan, 1.5, 0.9, 0.1])
    # Execute / Assert: the top three by loss; the tie goes to the earlier candidate
    np.testing.assert_array_equal(keep_highest(losses, 3), [1, 3, 4])
    np.testing.assert_array_equal(keep_highest(losses, 2), [1, 3])
    with pytest.raises(ValueError, match="k=7 of 6"):
        keep_highest(losses, 7)


def test_power_of_choice_asks_d_candidates_and_records_their_losses() -> None:
    # Prepare: a client's loss is its index; d = 20 of 100, k = 5
    bandit = selection_of("power-of-choice", 0, settings=PowerOfChoiceSettings(poc_d=20))
    asked: list[list[int]] = []

    def ask(indices: list[int], config: dict[str, object], with_model: bool = True
            ) -> list[RecordDict | None]:
        assert config == {LOCAL_LOSS_FIELD: 1} and with_model
        asked.append([int(i) for i in indices])
        return [RecordDict({"metrics": MetricRecord({LOCAL_LOSS_FIELD: float(i),
                                                     "num-examples": 10})}) for i in indices]

    # Execute
    choice = bandit.choose(KEYS, 1, 5, ask)
    # Assert: one query to 20 distinct candidates; the 5 with the highest loss kept; the
    # record names them, their losses and the query's cost
    assert len(asked) == 1 and len(set(asked[0])) == 20
    np.testing.assert_array_equal(choice.indices, sorted(asked[0])[-5:])
    assert choice.record is not None
    assert choice.record["candidates"] == [KEYS[i] for i in asked[0]]
    assert choice.record["candidate_losses"] == [float(i) for i in asked[0]]
    assert (bandit.costs()["extra_messages"], choice.record["query_examples"]) == (20, 200)
    with pytest.raises(ValueError, match="asks clients before it chooses: pass ask"):
        bandit.choose(KEYS, 2, 5)


def test_oort_utility_matches_the_formula_on_a_hand_built_round() -> None:
    # Prepare: a client of 4 samples with per-sample losses 1, 2, 2, 4 (squares sum 25)
    losses = np.array([1.0, 2.0, 2.0, 4.0])
    # Execute / Assert: |B| sqrt(sum l^2 / |B|) = 4 sqrt(25 / 4) = 10
    assert oort_utility(4, float((losses ** 2).sum())) == pytest.approx(10.0)
    assert oort_utility(0, 3.0) == 0.0
    # scores: utilities 10, 20, 30 last seen in rounds 1, 2, 4; round 5
    util, last = np.array([10.0, 20.0, 30.0]), np.array([1, 2, 4])
    low, span = 10.0 * 0.999, 30.0 - 10.0 * 0.999
    expected = [(u - low) / span + math.sqrt(0.1 * math.log(5) / r)
                for u, r in zip(util, last, strict=True)]
    np.testing.assert_allclose(oort_scores(util, last, 5), expected)
    assert oort_exploration(1, 0.3) == pytest.approx(0.9 * 0.98)
    assert oort_exploration(200, 0.3) == 0.3


def test_oort_exploits_high_utility_and_explores_the_untried() -> None:
    # Prepare: 50 explored clients with utility = index, 50 never tried; eps 0.3, k 10
    util = np.r_[np.arange(50.0), np.zeros(50)]
    last = np.r_[np.full(50, 3), np.zeros(50, dtype=int)]
    rng = np.random.default_rng(1)
    # Execute
    picks = [oort_select(util, last, 4, 10, 0.3, rng) for _ in range(200)]
    # Assert: 7 exploited from the top of the explored (cut at 95% of the 8th score), 3
    # explored among the untried, every round
    for p in picks:
        assert (p < 50).sum() == 7 and (p >= 50).sum() == 3
        assert p[p < 50].min() >= 40
    assert len(np.unique(np.concatenate([p[p >= 50] for p in picks]))) > 40


def test_round_ranks_scale_to_unit_interval_with_ties_shared() -> None:
    np.testing.assert_allclose(round_ranks(np.array([0.3, -0.1, 0.3, 0.0])),
                               [5 / 6, 0.0, 5 / 6, 1 / 3])
    np.testing.assert_allclose(round_ranks(np.array([7.0])), [0.5])


def test_posterior_shrinks_to_the_grand_mean_when_clients_differ_only_by_noise() -> None:
    # Prepare: two clients with equal means -> no between-client variance
    count, mean = np.array([4, 4, 0]), np.array([0.5, 0.5, 0.0])
    m2 = np.array([0.3, 0.3, 0.0])
    post_mean, post_var = posterior(count, mean, m2)
    np.testing.assert_allclose(post_mean, 0.5)
    np.testing.assert_allclose(post_var, 0.0)
    # clearly different means: tau2 = var(means) - s2 / n = 0.08 - 0.1 / 4 (hand-computed)
    post_mean, post_var = posterior(np.array([4, 4]), np.array([0.3, 0.7]), m2[:2])
    tau2, s2 = 0.08 - 0.025, 0.1
    precision = 1 / tau2 + 4 / s2
    np.testing.assert_allclose(post_var, 1 / precision)
    np.testing.assert_allclose(post_mean, (0.5 / tau2 + 4 * np.array([0.3, 0.7]) / s2)
                               / precision)


def run_posterior(true_phi: np.ndarray, rounds: int, seed: int, cap: float = 0.0,
                  mode: str = "posterior") -> np.ndarray:
    """Selection counts of the posterior (or ``mode``) selector over ``rounds`` rounds of 10
    of 100, each selected client's phi ``true_phi + N(0, 1)``."""
    bandit = selection_of(mode, seed, cap)
    noise = np.random.default_rng(seed + 1)
    counts = np.zeros(len(KEYS))
    for t in range(1, rounds + 1):
        chosen = bandit.choose(KEYS, t, 10).indices
        counts[chosen] += 1
        observe(bandit, [KEYS[i] for i in chosen], true_phi[chosen] + noise.normal(size=10))
    return counts


def test_posterior_selection_is_uniform_when_every_phi_is_iid_noise() -> None:
    # Execute: 300 rounds, every client's phi pure noise
    counts = run_posterior(np.zeros(100), 300, seed=0)
    # Assert: the counts are indistinguishable from uniform (chi-square, 3000 draws)
    assert chisquare(counts).pvalue > 0.05


def test_posterior_selection_favours_a_clearly_better_client() -> None:
    # Prepare: client 7's phi is 3 noise sd above everyone's
    true_phi = np.zeros(100)
    true_phi[7] = 3.0
    # Execute
    counts = run_posterior(true_phi, 300, seed=0)
    # Assert: chosen far more often than a uniform share (30 of 300 rounds)
    assert counts[7] > 3 * np.median(counts)


def test_resolved_harmful_matches_the_bound_computed_by_hand() -> None:
    # Prepare: four clients; pooled within variance s2 = (0.6 + 0.6) / (3 + 3) = 0.2
    count = np.array([4, 4, 1, 0])
    mean = np.array([-1.0, -0.5, -5.0, 0.0])
    m2 = np.array([0.6, 0.6, 0.0, 0.0])
    # Execute
    harmful = resolved_harmful(count, mean, m2, level=0.01)
    # Assert: z at 0.01 / (4 x 5); -1 + z sqrt(0.2 / 4) = -0.26 < 0, -0.5 + ... = +0.24 > 0;
    # one look (client 2) and none (client 3) never resolve
    z = norm.isf(0.01 / 20)
    assert -1.0 + z * math.sqrt(0.05) < 0.0 < -0.5 + z * math.sqrt(0.05)
    np.testing.assert_array_equal(harmful, [True, False, False, False])
    assert not resolved_harmful(np.array([1, 1]), np.array([-9.0, 3.0]), np.zeros(2), 0.01).any()


def test_screened_selection_is_uniform_when_every_phi_is_iid_noise() -> None:
    # Execute: 300 rounds, every client's phi pure noise around 0 (the threshold itself)
    counts = run_posterior(np.zeros(100), 300, seed=0, mode="screened")
    # Assert: the counts are indistinguishable from uniform (chi-square, 3000 draws)
    assert chisquare(counts).pvalue > 0.05


def test_screened_selection_drops_a_harmful_client_and_does_not_favour_a_booster() -> None:
    # Prepare: client 7's phi 3 noise sd below 0, client 8's 3 sd above (a booster's lead)
    true_phi = np.zeros(100)
    true_phi[7], true_phi[8] = -3.0, 3.0
    # Execute
    counts = run_posterior(true_phi, 300, seed=0, mode="screened")
    # Assert: client 7 is dropped after a few looks; client 8 gets about a uniform share
    assert counts[7] <= 3
    assert abs(counts[8] - np.median(counts)) <= 10
    # fewer than k clients left unscreened: the screened fill the round
    bandit = selection_of("screened", 0)
    bandit.selector.load({"rewards": {key: [5.0, -1.0 if int(key) >= 5 else 1.0, 0.1]
                                      for key in KEYS}})
    choice = bandit.choose(KEYS, 6, 10)
    assert set(range(5)) <= set(choice.indices.tolist())
    assert choice.record is not None and choice.record["screened"] == 95


def test_the_identity_cap_holds_for_a_client_every_selector_wants() -> None:
    # Prepare: client 7 clearly best; cap 2 x its uniform share
    true_phi = np.zeros(100)
    true_phi[7] = 3.0
    # Execute
    counts = run_posterior(true_phi, 300, seed=0, cap=2.0)
    # Assert: never more than 2 x (rounds x k / n) = 60 selections
    assert 55 <= counts[7] <= 60
    # a group counts as one identity: two linked clients share one limit
    eligible = cap_eligible(np.array([4, 3, 0]), np.array([0, 0, 1]), t=11, k=1, cap=2.0)
    # 4 + 3 = 7 reaches the limit 2 x 10 x 1 / 3 = 6.7
    np.testing.assert_array_equal(eligible, [False, False, True])
    assert cap_eligible(np.array([50, 0]), np.array([0, 1]), 2, 1, 0.0).all()


def test_the_posterior_selector_runs_with_its_own_cap_by_default_and_others_without() -> None:
    # Prepare / Execute: the default cap (-1) resolved per selector; explicit caps kept
    resolved = {sel: resolve_auto("owen-antithetic", sel).cap
                for sel in ("posterior", "adaptive", "screened", "random")}
    # Assert: 3 for the posterior (as developed), off for the rest (as published)
    assert resolved == {"posterior": 3.0, "adaptive": 0.0, "screened": 0.0, "random": 0.0}
    assert resolve_auto("none", "oort", "uniform").cap == 0.0
    assert resolve_auto("owen-antithetic", "posterior", cap=0.0).cap == 0.0
    assert resolve_auto("owen-antithetic", "adaptive", cap=2.0).cap == 2.0
    # the selection resolves it the same way: a clearly best client held at 3 x its share
    bandit = selection_of("posterior", 0)
    noise, counts = np.random.default_rng(1), np.zeros(len(KEYS))
    for t in range(1, 201):
        chosen = bandit.choose(KEYS, t, 10).indices
        counts[chosen] += 1
        observe(bandit, [KEYS[i] for i in chosen], (np.arange(100) == 7)[chosen] * 3.0
                + noise.normal(size=10))
    assert 55 <= counts[7] <= 60  # 3 x (200 x 10 / 100)
    with pytest.raises(ValueError, match=r"cap=-0\.5 must be 0 \(off\), -1"):
        SelectionParams(cap=-0.5)


@pytest.mark.parametrize("reward", ["rank", "phi"])
def test_a_x50_booster_earns_no_more_reward_than_its_honest_step(reward: str) -> None:
    # Prepare: the same round with c0 honest and with c0 sending 50 x its step, valued under
    # the default guards (direction-only valuation: every update at the reference norm)
    from fedowen_strategy.round.round_step import aggregate_round

    ids = ["c0", "c1", "c2", "c3", "c4"]
    rewards = {}
    for boost in (1.0, 50.0):
        out = aggregate_round(
            round_of(boost, ids), {"w": np.zeros(4)}, selected=ids,
            valuation=ValuationSettings(method="exact", game="delta"),
            guards=Guards(), norm_cap="median", utility_factory=delta_game,
            rng=np.random.default_rng(0), server_round=3)
        assert out.valuation is not None
        selector = Posterior(PosteriorSettings(reward=reward))
        selector.observe(Seen(3, tuple(u.client_id for u in out.parsed.updates),
                              out.valuation.phi))
        rewards[boost] = selector.rewards["c0"][1]
    # Assert: the reward (rank or phi) of the boosted update is no larger than the honest one's.
    # (c4 is an exact copy of honest c0 here; with the link guard off, link-cosine 0, the
    # boosted c0 escapes the copy guard and its phi share rises from 0.125 to 0.2, its rank
    # does not: the default link guard links the two either way.)
    assert rewards[50.0] <= rewards[1.0] + 1e-12


def test_selectors_survive_a_checkpoint_and_need_what_they_rank_by() -> None:
    # Prepare: each selector that remembers after a few rounds (Oort's utilities 1-2)
    replies = tuple(RecordDict({"metrics": MetricRecord({"num-examples": 1,
                                                         LOSS_SQUARES_FIELD: u ** 2})})
                    for u in np.linspace(1, 2, 10))
    for mode in ("adaptive", "posterior", "screened", "oort"):
        bandit = selection_of(mode, 3, cap=2.0)
        for t in range(1, 4):
            chosen = bandit.choose(KEYS, t, 10).indices
            observe(bandit, [KEYS[i] for i in chosen], np.linspace(0, 1, 10), t, replies)
        assert bandit.selector.state()
        restored = selection_of(mode, 9, cap=2.0)
        # Execute
        restored.load(json.loads(json.dumps(bandit.state())))
        # Assert: the same next pick
        np.testing.assert_array_equal(restored.choose(KEYS, 4, 10).indices,
                                      bandit.choose(KEYS, 4, 10).indices)
    assert resolve_auto("none", "power-of-choice", "uniform").selection == "power-of-choice"
    assert resolve_auto("none", "oort", "uniform").selection == "oort"
    for mode in ("posterior", "screened"):
        with pytest.raises(ValueError, match=f"selection='{mode}' ranks clients by phi"):
            resolve_auto("none", mode, "uniform")
    with pytest.raises(ValueError, match=r"cap=0\.5 must be 0"):
        SelectionParams(cap=0.5)
