"""Exclusion after a resolved negative contribution, around any selector
(:mod:`fedowen_strategy.selectors.exclusion`; issue 72, deliver 4): the test on hand-built
phi, the pool and the weights it changes, its state, and rounds through FedOwen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedowen_strategy.selectors import registry
from fedowen_strategy.selectors.base import Seen
from fedowen_strategy.selectors.exclusion import Excluding, zero_excluded
from fedowen_strategy.selectors.random import Random, RandomSettings
from fedowen_strategy.selectors.screened import resolved_harmful
from fedowen_strategy.selectors.shared import Selection, SelectionParams
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from tests.test_strategy import BAD, run_toy

#: Two valued rounds of four clients: h1, h2 helpful, y mildly and x clearly harmful. Each
#: client's phi differ by 0.2, so every sum of squared deviations is 0.02 and the pooled
#: within-client variance s2 = 4 x 0.02 / 4 = 0.02.
ROUNDS = [{"h1": 0.1, "h2": 0.2, "x": -0.4, "y": -0.1},
          {"h1": 0.3, "h2": 0.0, "x": -0.6, "y": -0.3}]
#: The one-sided normal quantile at 0.05 / (2 x 3), the level's share of a client's 2nd look
Z_AT_2 = 2.39398


def excluding(level: float = 0.05, min_rounds: int = 2, seed: int = 0) -> Selection:
    """A run's selection: uniform draws behind the exclusion, as the registry builds it."""
    params = SelectionParams(exclusion_level=level, exclusion_min_rounds=min_rounds)
    return registry.selection("random", None, params, 0.0, np.random.default_rng(seed))


def show(selection: Selection, rounds: list[dict[str, float]], first: int = 1) -> None:
    for t, phi in enumerate(rounds, start=first):
        ids = sorted(phi)
        selection.observe(Seen(t, tuple(ids), np.array([phi[c] for c in ids])))


def no_ask(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the uniform draw asks no client")


def test_the_test_by_hand() -> None:
    # Prepare: the two rounds' counts, means and sums of squared deviations (h1 h2 x y)
    count, mean = np.array([2, 2, 2, 2]), np.array([0.2, 0.1, -0.5, -0.2])
    m2 = np.full(4, 0.02)
    # Execute
    harmful = resolved_harmful(count, mean, m2, 0.05)
    # Assert: upper bound = mean + z sqrt(0.02 / 2) = mean + 0.1 z, z = 2.394: x at -0.261
    # is resolved below 0, y at +0.039 is not
    assert -0.5 + 0.1 * Z_AT_2 < 0 < -0.2 + 0.1 * Z_AT_2
    np.testing.assert_array_equal(harmful, [False, False, True, False])
    # min_count 3: two valued rounds are not enough for anyone
    assert not resolved_harmful(count, mean, m2, 0.05, min_count=3).any()


def test_a_client_resolved_harmful_is_not_drawn_again_and_weighs_nothing() -> None:
    # Prepare
    selection = excluding()
    show(selection, ROUNDS)
    keys = ["h1", "h2", "x", "y"]
    # Execute: 50 draws of 3 of the 4
    draws = [selection.choose(keys, 3 + t, 3, no_ask) for t in range(50)]
    # Assert: x (excluded after round 2) never drawn, the other three every time
    assert all([keys[i] for i in d.indices] == ["h1", "h2", "y"] for d in draws)
    assert draws[0].record is not None and draws[0].record["excluded"] == ["x"]
    assert selection.selector.state()["excluded"] == {"x": 2}
    # with k = 4 the excluded fills the round, and weighs 0 in it (the rest renormalised)
    assert list(selection.choose(keys, 60, 4, no_ask).indices) == [0, 1, 2, 3]
    weights = selection.weigh(["h1", "h2", "x", "y"], np.array([0.2, 0.2, 0.4, 0.2]))
    np.testing.assert_allclose(weights, [1 / 3, 1 / 3, 0.0, 1 / 3])


def test_min_rounds_waits_for_the_third_valued_round() -> None:
    # Prepare: min_rounds 3
    selection = excluding(min_rounds=3)
    show(selection, ROUNDS)
    assert selection.selector.state()["excluded"] == {}
    # Execute: a third round in which only x is valued (phi -0.5: its mean stays -0.5)
    show(selection, [{"x": -0.5}], first=3)
    # Assert: s2 = 4 x 0.02 / 5 = 0.016; at its third look z = 2.638 (0.05 / 12), so the
    # bound -0.5 + 2.638 sqrt(0.016 / 3) = -0.307 < 0
    assert -0.5 + 2.63826 * np.sqrt(0.016 / 3) == pytest.approx(-0.3073, abs=1e-4)
    assert selection.selector.state()["excluded"] == {"x": 3}


def test_zero_excluded_by_hand() -> None:
    # Prepare
    w = np.array([0.5, 0.3, 0.2])
    # Execute
    renormalised = zero_excluded(w, [False, True, False])
    step = zero_excluded(w, [False, True, False], renormalise=False)
    # Assert: the others scaled back to sum 1; a step from the global model (DELTA's
    # weights) is not renormalised; nobody left: None; nobody excluded: as they were
    assert renormalised is not None and step is not None
    np.testing.assert_allclose(renormalised, np.array([0.5 / 0.7, 0.0, 0.2 / 0.7]))
    np.testing.assert_allclose(step, np.array([0.5, 0.0, 0.2]))
    assert zero_excluded(w, [True, True, True]) is None
    assert zero_excluded(w, [False] * 3) is w
    with pytest.raises(ValueError, match="3 weights but 2 exclusion flags"):
        zero_excluded(w, [True, False])


def test_a_round_of_excluded_clients_alone_keeps_its_weights() -> None:
    selection = excluding()
    show(selection, ROUNDS)
    np.testing.assert_allclose(selection.weigh(["x"], np.array([1.0])), [1.0])


def test_state_round_trip_gives_the_same_draws() -> None:
    # Prepare
    first = excluding(seed=4)
    show(first, ROUNDS)
    saved = first.state()
    # Execute
    second = excluding(seed=99)
    second.load(saved)
    keys = ["h1", "h2", "x", "y", "z"]
    # Assert: the same excluded, the same book, the same draws
    assert second.selector.state() == first.selector.state()
    for t in range(3, 8):
        np.testing.assert_array_equal(second.choose(keys, t, 2, no_ask).indices,
                                      first.choose(keys, t, 2, no_ask).indices)


def test_a_checkpoint_without_exclusion_loads_as_the_wrapped_selectors() -> None:
    plain = registry.selection("random", None, SelectionParams(), 0.0,
                               np.random.default_rng(1))
    wrapped = excluding()
    wrapped.load(plain.state())
    assert wrapped.selector.state() == {"inner": {}, "book": {}, "excluded": {}}


def test_bad_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"level=1\.5, min_rounds=2"):
        Excluding(Random(RandomSettings()), 1.5)
    problems = SelectionParams.problems_of({"exclusion_level": -0.1,
                                            "exclusion_min_rounds": 1})
    assert len(problems) == 2 and "exclusion_level=-0.1" in problems[0]


def test_off_by_default_and_on_from_the_run_config() -> None:
    # the defaults leave the selector unwrapped (pinned runs run as before)
    default = parse_run_config({})
    assert default.selection_params().exclusion_level == 0.0
    plain = registry.selection("adaptive", None, default.selection_params(), 0.0,
                               np.random.default_rng(0))
    assert not isinstance(plain.selector, Excluding)
    on = parse_run_config({"exclusion-level": 0.05, "exclusion-min-rounds": 3})
    wrapped = registry.selection("adaptive", None, on.selection_params(), 0.0,
                                 np.random.default_rng(0))
    assert isinstance(wrapped.selector, Excluding) and wrapped.selector.min_rounds == 3
    # a key whose default is the run's length rebuilds the selector: still wrapped
    hics = registry.selection("hics-phi", None, on.selection_params(), 0.0,
                              np.random.default_rng(0))
    hics.for_run(30)
    assert isinstance(hics.selector, Excluding)


def test_through_fedowen_the_two_harmful_clients_weigh_0_once_resolved(tmp_path: Path
                                                                        ) -> None:
    # Execute: the toy's 6 clients every round (c4 and c5 move the model away), exclusion on
    strategy = run_toy("owen", rounds=5, k=6, tmp_path=tmp_path, selection="random",
                       selection_params=SelectionParams(exclusion_level=0.05))
    # Assert: both valued below 0 twice, resolved after round 2; from round 3 they fill the
    # round (6 of 6) at weight 0, the four others' weights summing to 1
    rounds = read_rounds(tmp_path)[1:]
    bad = {f"c{i}" for i in BAD}
    assert all(r["phi"][c] < 0 for r in rounds[:2] for c in bad)
    assert strategy.chooser.state()["state"]["excluded"] == {"c4": 2, "c5": 2}
    assert [r["selection"]["excluded"] for r in rounds] == [[], []] + [["c4", "c5"]] * 3
    assert all(r["weights"][c] > 0 for r in rounds[:2] for c in bad)
    for r in rounds[2:]:
        assert all(r["weights"][c] == 0.0 for c in bad)
        assert sum(r["weights"].values()) == pytest.approx(1.0)


def test_through_fedowen_an_excluded_client_is_not_drawn_again(tmp_path: Path) -> None:
    # Execute: 4 of the 6 a round, uniformly
    strategy = run_toy("owen", rounds=8, k=4, tmp_path=tmp_path, selection="random",
                       selection_params=SelectionParams(exclusion_level=0.05))
    # Assert: once a client is excluded no later round selects it
    excluded = strategy.chooser.state()["state"]["excluded"]
    assert set(excluded) == {f"c{i}" for i in BAD}
    for r in read_rounds(tmp_path)[1:]:
        assert not {c for c, t in excluded.items() if r["round"] > t} & set(r["selected"])
