"""GreedyFed (issue 62, deliver 2): round-robin start and greedy top-k on hand-built values
(the peers spec's section 1f), its memory variants, seeded tie-breaking, stale values, its
state round trip, and a short run through FedOwen with GTG-Shapley and with FedOwen's
valuation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedowen_strategy.selectors.base import Pool, Seen
from fedowen_strategy.selectors.greedyfed import (
    GreedyFed,
    GreedyFedSettings,
    accumulate,
    memory_weight,
    round_robin,
    top_k,
)
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from tests.test_strategy import BAD, run_toy

KEYS = tuple(f"c{i}" for i in range(5))


def no_ask(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("GreedyFed asks the clients nothing")


def pick(selector: GreedyFed, keys: tuple[str, ...], k: int, t: int,
         rng: np.random.Generator) -> list[int]:
    choice = selector.choose(Pool(keys, k, t), rng, no_ask)
    return [int(keys[i][1:]) for i in choice.indices]


def show(selector: GreedyFed, t: int, phi: dict[int, float]) -> None:
    selector.observe(Seen(t, tuple(f"c{i}" for i in phi), np.array(list(phi.values()))))


def warmed_up(memory: str, rng: np.random.Generator) -> GreedyFed:
    """N = 5, k = 2: rounds 1-3 round-robin ({0, 1}, {2, 3}, {4, r}), observed as the spec's
    hand test (r = 0 observed whatever was drawn)."""
    selector = GreedyFed(GreedyFedSettings(greedyfed_memory=memory))
    assert pick(selector, KEYS, 2, 1, rng) == [0, 1]
    show(selector, 1, {0: 0.10, 1: 0.30})
    assert pick(selector, KEYS, 2, 2, rng) == [2, 3]
    show(selector, 2, {2: 0.05, 3: 0.21})
    third = pick(selector, KEYS, 2, 3, rng)
    assert 4 in third and len(third) == 2
    show(selector, 3, {4: 0.25, 0: 0.30})
    return selector


def test_round_robin_start_n5_k2_fills_the_last_round_uniformly() -> None:
    # Execute: the third round's second client over many seeds
    fills = []
    for seed in range(200):
        selector = GreedyFed(GreedyFedSettings())
        rng = np.random.default_rng(seed)
        picks = [pick(selector, KEYS, 2, 1, rng)]
        show(selector, 1, {0: 0.1, 1: 0.3})
        picks.append(pick(selector, KEYS, 2, 2, rng))
        show(selector, 2, {2: 0.05, 3: 0.21})
        third = pick(selector, KEYS, 2, 3, rng)
        fills.append(next(i for i in third if i != 4))
        assert picks == [[0, 1], [2, 3]] and 4 in third
    # Assert: r uniform on {0, 1, 2, 3} (each 50 of 200 expected; 4 sd = 24.5)
    counts = np.bincount(fills, minlength=4)
    assert counts.sum() == 200 and np.all(np.abs(counts - 50) < 25), counts


def test_round_robin_start_n4_k2_is_greedy_from_the_third_round() -> None:
    # Prepare
    selector = GreedyFed(GreedyFedSettings())
    rng = np.random.default_rng(0)
    keys = KEYS[:4]
    # Execute
    first = pick(selector, keys, 2, 1, rng)
    show(selector, 1, {0: 0.1, 1: 0.4})
    second = pick(selector, keys, 2, 2, rng)
    show(selector, 2, {2: 0.3, 3: 0.2})
    choice = selector.choose(Pool(keys, 2, 3), rng, no_ask)
    # Assert: the paper's ceil(4 / 2) = 2 warm-up rounds (the code would draw a random third)
    assert (first, second) == ([0, 1], [2, 3])
    assert choice.how == "greedy" and choice.indices.tolist() == [1, 2]


@pytest.mark.parametrize(("memory", "fourth", "observed", "fifth"), [
    ("mean", [1, 4], {1: 0.02, 4: 0.28}, [3, 4]),   # SV [.20 .16 .05 .21 .265]
    ("0.5", [1, 4], {1: 0.02, 4: 0.28}, [3, 4]),    # the same numbers as mean here
    ("0.9", [1, 4], {1: 0.02, 4: 0.28}, [1, 4]),    # SV0 = .12; then SV1 .272, SV4 .253
    ("0", [0, 1], {0: 0.05, 1: 0.02}, [3, 4]),      # the latest phi only
])
def test_greedy_top_k_with_each_memory(memory: str, fourth: list[int],
                                       observed: dict[int, float], fifth: list[int]) -> None:
    # Prepare
    rng = np.random.default_rng(1)
    selector = warmed_up(memory, rng)
    # Execute
    first = selector.choose(Pool(KEYS, 2, 4), rng, no_ask)
    show(selector, 4, observed)
    second = pick(selector, KEYS, 2, 5, rng)
    # Assert
    assert first.how == "greedy" and first.record is not None
    assert set(first.record) == {"unvalued"}
    assert first.record["unvalued"] == 0
    assert [int(KEYS[i][1:]) for i in first.indices] == fourth
    assert second == fifth


def test_cumulative_values_by_hand() -> None:
    rng = np.random.default_rng(1)
    assert warmed_up("mean", rng).values == pytest.approx(
        {"c0": 0.20, "c1": 0.30, "c2": 0.05, "c3": 0.21, "c4": 0.25})
    assert warmed_up("0.9", rng).values["c0"] == pytest.approx(0.12)
    assert accumulate(None, 0, 0.3, 0.9) == 0.3  # the first phi sets the value
    assert accumulate(0.2, 2, 0.5, None) == pytest.approx(0.3)  # (2 x 0.2 + 0.5) / 3
    assert accumulate(0.2, 2, 0.5, 0.0) == 0.5


def test_ties_are_broken_uniformly_with_the_seeded_rng() -> None:
    # Execute
    rng = np.random.default_rng(0)
    firsts = [top_k(np.array([0.2, 0.2, 0.1]), 1, rng)[0] for _ in range(2000)]
    again = [top_k(np.array([0.2, 0.2, 0.1]), 1, np.random.default_rng(0))[0]
             for _ in range(3)]
    # Assert: 0 or 1, each with probability 1/2 (1000 expected; 4 sd = 89); seeded
    assert set(firsts) == {0, 1}
    assert abs(firsts.count(0) - 1000) < 89
    assert len(set(again)) == 1
    assert top_k(np.array([0.1, 0.5, 0.3, 0.4]), 2, rng).tolist() == [1, 3]


def test_round_robin_by_hand() -> None:
    rng = np.random.default_rng(0)
    assert round_robin(np.array([True, False, True, False, False]), 2, rng).tolist() == [1, 3]
    last = round_robin(np.array([True, True, True, False]), 3, rng)
    assert 3 in last and len(set(last.tolist())) == 3


def test_absent_clients_keep_stale_values_and_an_unvalued_round_changes_nothing() -> None:
    # Prepare
    rng = np.random.default_rng(1)
    selector = warmed_up("mean", rng)
    before = dict(selector.values)
    # Execute: c1 and c4 leave the pool; a round with no phi
    available = ("c0", "c2", "c3")
    choice = selector.choose(Pool(available, 2, 4), rng, no_ask)
    selector.observe(Seen(4, ("c0", "c3"), None))
    # Assert: the greedy pick among those present, by their stale values
    assert [available[i] for i in choice.indices] == ["c0", "c3"]
    assert selector.values == before


def test_a_client_joining_late_goes_through_the_round_robin_path() -> None:
    rng = np.random.default_rng(1)
    selector = warmed_up("mean", rng)
    choice = selector.choose(Pool((*KEYS, "c5"), 2, 4), rng, no_ask)
    assert choice.how == "round-robin" and 5 in choice.indices.tolist()
    assert choice.record is not None and choice.record["unvalued"] == 1


def test_state_round_trip_gives_the_same_next_pick() -> None:
    # Prepare
    rng = np.random.default_rng(1)
    selector = warmed_up("0.9", rng)
    state = json.loads(json.dumps(selector.state()))
    # Execute
    again = GreedyFed(GreedyFedSettings(greedyfed_memory="0.9"))
    again.load(state)
    # Assert
    assert again.state() == selector.state()
    a = selector.choose(Pool(KEYS, 2, 4), np.random.default_rng(5), no_ask)
    b = again.choose(Pool(KEYS, 2, 4), np.random.default_rng(5), no_ask)
    np.testing.assert_array_equal(a.indices, b.indices)


@pytest.mark.parametrize("memory", ["latest", "1.5", "-0.1", "nan"])
def test_bad_memory_is_a_clear_error(memory: str) -> None:
    with pytest.raises(ValueError, match=rf"greedyfed_memory='{memory}': must be 'mean' or"):
        GreedyFedSettings(greedyfed_memory=memory)
    with pytest.raises(ValueError, match=rf"greedyfed-memory='{memory}': must be 'mean' or"):
        parse_run_config({"selection": "greedyfed", "greedyfed-memory": memory})
    assert memory_weight("0.1") == 0.1 and memory_weight("mean") is None


def test_the_run_config_refuses_greedyfed_without_phi() -> None:
    with pytest.raises(ValueError, match="selection='greedyfed' ranks clients by phi"):
        parse_run_config({"selection": "greedyfed", "valuation": "none"})
    cfg = parse_run_config({"selection": "greedyfed", "valuation": "gtg-greedyfed",
                            "greedyfed-memory": "0.9", "aggregation": "examples"})
    assert cfg.selector_settings() == GreedyFedSettings(greedyfed_memory="0.9")


@pytest.mark.parametrize("valuation", ["gtg-greedyfed", "owen"])
def test_four_rounds_through_fedowen(valuation: str, tmp_path: Path) -> None:
    # Execute: 2 of the toy's 6 clients a round (c4, c5 move the model away)
    strategy = run_toy(valuation, rounds=4, k=2, tmp_path=tmp_path, selection="greedyfed",
                       aggregation="examples")
    # Assert: three round-robin rounds cover the six, then the two of highest value
    rounds = read_rounds(tmp_path)[1:]
    assert [r["selected"] for r in rounds[:3]] == [["c0", "c1"], ["c2", "c3"], ["c4", "c5"]]
    assert [r["selection"]["how"] for r in rounds] == ["round-robin"] * 3 + ["greedy"]
    values = strategy.chooser.state()["state"]["values"]
    after_three = {c: rounds[int(c[1]) // 2]["phi"][c] for c in values}
    best = sorted(after_three, key=lambda c: -after_three[c])[:2]
    assert sorted(rounds[3]["selected"]) == sorted(best)
    assert not {f"c{i}" for i in BAD} & set(rounds[3]["selected"])
    # its cost: no query messages, its own seconds, the valuation's evaluations
    assert all(r["selection"]["extra_messages"] == 0 for r in rounds)
    assert all(r["selection"]["selector_seconds"] >= 0 for r in rounds)
    assert all(r["n_evals"] > 0 and "valuation_seconds" in r for r in rounds)
