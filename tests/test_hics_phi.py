"""hics-phi (issue 62, deliver 3): HiCS-FL's cluster slots filled by Algorithm 2 on phi. A
rare-label cluster keeps its slots while phi concentrates elsewhere, Algorithm 2 decides
within a cluster, the warm-up, its state, its settings, and four rounds through FedOwen."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from fedowen_strategy.round.contribution import ValuationSettings
from fedowen_strategy.selectors.adaptive import Adaptive
from fedowen_strategy.selectors.base import Pool
from fedowen_strategy.selectors.hics_phi import HicsPhi, HicsPhiSettings, draw_within
from fedowen_task.config import ConfigError
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from tests.test_hics import A, B, C, D, never
from tests.test_hics_selector import run_hics_toy, seen

KEYS = tuple(f"c{i}" for i in range(6))
#: c0, c1 hold one label (class 0): the rare-label cluster; c2-c5 are balanced (C, D).
UPDATES = {"c0": A, "c1": A, "c2": C, "c3": D, "c4": C, "c5": D}
#: phi concentrates on the balanced clients; the one-label ones were valued lowest.
PHI = {"c0": 0.0, "c1": 0.0, "c2": 0.4, "c3": 0.3, "c4": 0.2, "c5": 0.1}


def loaded(**settings: Any) -> HicsPhi:
    """hics-phi with every client estimated and valued once (Algorithm 2 exploiting only, the
    clusters drawn uniformly: gamma 0)."""
    selector = HicsPhi(HicsPhiSettings(**{"epsilon": 0.0, "hics_gamma": 0.0,
                                          "hics_temperature": 0.01, "hics_rounds": 100,
                                          **settings}))
    selector.load({"estimates": {"updates": UPDATES, "tried": list(KEYS)},
                   "bandit": {"phi": PHI, "counts": dict.fromkeys(KEYS, 1)}})
    return selector


def test_a_rare_label_cluster_keeps_its_slots_while_phi_concentrates_elsewhere() -> None:
    # Prepare: k = 2 from M = 2 clusters ({c0, c1} one label, {c2..c5} balanced), each drawn
    # with 1/2: the one-label cluster's slots are 0, 1, 2 with 1/4, 1/2, 1/4
    selector, alone = loaded(), Adaptive(HicsPhiSettings(epsilon=0.0))
    alone.load({"phi": PHI, "counts": dict.fromkeys(KEYS, 1)})
    rng, rounds = np.random.default_rng(0), 4000
    rare, bandit_rare, within = 0, 0, np.zeros(4)
    # Execute: round 200 each time (Algorithm 2's bonus depends on the round)
    for _ in range(rounds):
        choice = selector.choose(Pool(KEYS, 2, 200), rng, never)
        picks = set(choice.indices.tolist())
        rare += len(picks & {0, 1})
        if len(picks & {0, 1}) == 1:  # one slot each: Algorithm 2's pick among c2..c5
            within[min(picks - {0, 1}) - 2] += 1
        bandit_rare += len(set(alone.choose(Pool(KEYS, 2, 200), rng, never).indices.tolist())
                           & {0, 1})
    # Assert: the one-label cluster keeps half the slots (1 a round, se 0.011); Algorithm 2
    # over the pool never gives it one (its phi is the lowest: probability 0 once shifted)
    assert abs(rare / rounds - 1.0) < 0.05
    assert bandit_rare == 0
    assert choice.record is not None and choice.record["clusters"] == 2
    assert choice.record["cluster_p"] == [0.5, 0.5] and choice.how == "hics-phi"
    # within the balanced cluster, Algorithm 2's probabilities over the pool restricted to it:
    # phi + the bonus b = 0.1 sqrt(ln 201 / 2), less the pool's minimum, the one-label
    # clients' 0.1 b (below tau): (0.4, 0.3, 0.2, 0.1) + 0.9 b, normalised
    b = 0.1 * np.sqrt(np.log(201) / 2)
    expected = np.array([0.4, 0.3, 0.2, 0.1]) + 0.9 * b
    expected /= expected.sum()  # (0.3445, 0.2815, 0.2185, 0.1555)
    share = within / within.sum()
    se = np.sqrt(expected * (1 - expected) / within.sum())
    assert np.all(np.abs(share - expected) < 4 * se)


def test_too_few_positive_members_are_topped_up_uniformly() -> None:
    # Prepare: one member of three with a positive probability, two slots
    probs, members = np.array([0.0, 1.0, 0.0, 0.0]), np.array([0, 1, 3])
    rng = np.random.default_rng(5)
    # Execute
    draws = {tuple(sorted(draw_within(probs, members, 2, False, rng))) for _ in range(200)}
    # Assert: client 1 always, the other slot either of {0, 3}
    assert draws == {(0, 1), (1, 3)}


def test_early_rounds_prefer_balanced_clusters_as_hics_fl() -> None:
    # Prepare: gamma 4 in round 1 of 100: softmax(4 x (0.2618, 1.3813)) = (0.0113, 0.9887)
    selector = loaded(hics_gamma=4.0, hics_rounds=100)
    # Execute
    choice = selector.choose(Pool(KEYS, 2, 1), np.random.default_rng(1), never)
    # Assert
    assert choice.record is not None
    assert choice.record["cluster_p"] == pytest.approx([0.0113, 0.9887], abs=1e-4)


def test_exploration_draws_a_clusters_slots_uniformly() -> None:
    # epsilon 1: Algorithm 2 explores in every cluster, and the record counts them
    choice = loaded(epsilon=1.0).choose(Pool(KEYS, 2, 5), np.random.default_rng(2), never)
    assert choice.record is not None
    assert choice.record["explored"] == len(choice.record["slots"])
    assert sum(choice.record["slots"]) == 2


def test_warm_up_first_then_clusters() -> None:
    # Prepare: N = 7, k = 3, every client's update observed
    selector = HicsPhi(HicsPhiSettings(hics_temperature=0.01, hics_rounds=10))
    keys, rng = tuple(f"c{i}" for i in range(7)), np.random.default_rng(0)
    updates = {f"c{i}": (A if i < 2 else B if i < 4 else C if i % 2 else D) for i in range(7)}
    # Execute: three rounds, each observed
    records = []
    for t in (1, 2, 3):
        choice = selector.choose(Pool(keys, 3, t), rng, never)
        records.append((choice.how, choice.record))
        selector.observe(seen(t, {keys[i]: updates[keys[i]] for i in choice.indices}))
    # Assert: 3 + 3 never-selected clients, then the last one and 2 from the clusters
    assert [(how, r["warmup"]) for how, r in records] == [("warm-up", 3), ("warm-up", 3),
                                                         ("hics-phi", 1)]
    assert records[2][1]["clusters"] == 3 and sum(records[2][1]["slots"]) == 2
    assert selector.train_config() == {"step-scale": 1}


def test_state_round_trips_through_json() -> None:
    # Prepare
    first, rng = loaded(epsilon=0.1), np.random.default_rng(3)
    first.choose(Pool(KEYS, 2, 3), rng, never)
    # Execute
    again = HicsPhi(HicsPhiSettings(epsilon=0.1, hics_gamma=0.0, hics_temperature=0.01,
                                    hics_rounds=100))
    again.load(json.loads(json.dumps(first.state())))
    state = rng.bit_generator.state
    a = first.choose(Pool(KEYS, 3, 4), rng, never)
    rng.bit_generator.state = state
    b = again.choose(Pool(KEYS, 3, 4), rng, never)
    # Assert
    assert again.state() == json.loads(json.dumps(first.state()))
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.record is not None and b.record is not None
    assert a.record == b.record


def test_it_reads_hics_fls_and_algorithm_2s_keys() -> None:
    cfg = parse_run_config({"selection": "hics-phi", "epsilon": 0.2, "hics-gamma": 0.0,
                            "bandit-memory": "latest"})
    assert cfg.selector_settings() == HicsPhiSettings(epsilon=0.2, hics_gamma=0.0,
                                                      memory="latest",
                                                      hics_rounds=cfg.num_server_rounds)
    # one mistake, one problem, named by its key (each owner's rule)
    for bad, name in (({"hics-lambda": -1.0}, "hics-lambda=-1.0"), ({"tau": np.nan}, "tau=")):
        with pytest.raises(ConfigError) as err:
            parse_run_config({"selection": "hics-phi", **bad})
        (problem,) = err.value.problems
        assert problem.startswith(name)
    # no model check: a model without a usable output bias runs as one cluster
    # (tests/test_hics_phi_one_cluster.py), where hics-fl refuses it
    assert HicsPhiSettings().model_problems({"w": np.zeros(4)}, 4) == []


def test_four_rounds_through_fedowen(tmp_path: Any) -> None:
    # Prepare / Execute: the HiCS-FL toy (clients 0-3 one label each, 4-5 balanced), 2 a round
    strategy = run_hics_toy(HicsPhiSettings(hics_rounds=4), 4, tmp_path,
                            ValuationSettings(method="owen", budget_m=4, aggregation="softmax",
                                              game="average"))
    # Assert: every client once in the warm-up, then one round from the clusters
    rounds = read_rounds(tmp_path)[1:]
    assert sorted(c for r in rounds[:3] for c in r["selected"]) == list(KEYS)
    assert [r["selection"]["how"] for r in rounds] == ["warm-up"] * 3 + ["hics-phi"]
    assert sum(rounds[3]["selection"]["slots"]) == 2 and rounds[3]["selection"]["clusters"] == 2
    memory = strategy.chooser.state()["state"]
    assert set(memory["bandit"]["phi"]) == set(KEYS) == set(memory["estimates"]["updates"])
    assert all(sum(r["weights"].values()) == pytest.approx(1.0) for r in rounds)
    assert any(sorted(r["weights"].values()) != [0.5, 0.5] for r in rounds)  # softmax(phi)
