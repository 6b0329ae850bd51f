"""delta-phi (issue 62, deliver 3): DELTA's unbiased draw with phi as the utility. Its masses
and draw probabilities on hand-built phi, unbiasedness by exact enumeration of the draws, the
floor's two ends, its state, its key, and four rounds through FedOwen."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from fedowen_strategy.round.aggregation import step_average
from fedowen_strategy.selectors.base import Pool, Seen
from fedowen_strategy.selectors.delta_phi import DeltaPhi, DeltaPhiSettings, phi_masses
from fedowen_task.config import ConfigError
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from tests.test_delta import Fixed, no_ask, softmax_share
from tests.test_strategy import run_toy

KEYS = ("a", "b", "c", "d")
#: Remembered phi: a and b helped, c hurt, d was never valued.
MEMORY = {"phi": {"a": 0.3, "b": 0.1, "c": -0.2}, "counts": {"a": 2, "b": 1, "c": 3}}
#: Their masses: positive parts (0.3, 0.1, 0) over their mean 0.4 / 3, d the mean 1: total 4;
#: q = 0.5 x mass / 4 + 0.5 / 4.
Q = np.array([0.5 * 2.25 / 4 + 0.125, 0.5 * 0.75 / 4 + 0.125, 0.125, 0.5 * 1.0 / 4 + 0.125])


def loaded(**settings: object) -> DeltaPhi:
    selector = DeltaPhi(DeltaPhiSettings(**settings))  # type: ignore[arg-type]
    selector.load({"bandit": MEMORY})
    return selector


def test_masses_are_the_positive_part_of_phi_over_its_mean() -> None:
    np.testing.assert_allclose(phi_masses(np.array([0.3, 0.1, -0.2])), [2.25, 0.75, 0.0])
    # scale-free; none positive (or none valued): every mass the mean, 1
    np.testing.assert_allclose(phi_masses(np.array([30.0, 10.0, -20.0])), [2.25, 0.75, 0.0])
    np.testing.assert_allclose(phi_masses(np.array([-0.1, 0.0])), [1.0, 1.0])
    assert phi_masses(np.array([])).size == 0


def test_the_draw_probabilities_on_hand_built_phi() -> None:
    # Prepare: the floor at its default, 0.5; every client drawn once (k = 4)
    selector = loaded()
    # Execute
    choice = selector.choose(Pool(KEYS, 4, 3), Fixed((0, 1, 2, 3)), no_ask)  # type: ignore[arg-type]
    # Assert: q = (0.40625, 0.21875, 0.125, 0.25); the unvalued d is counted
    assert choice.record is not None and choice.how == "delta-phi"
    np.testing.assert_allclose([choice.record["q"][c] for c in KEYS], Q)
    np.testing.assert_allclose(Q, [0.40625, 0.21875, 0.125, 0.25])
    assert choice.record["unseen"] == 1
    assert choice.record["draws"] == dict.fromkeys(KEYS, 1)


@pytest.mark.parametrize(("floor", "expected"), [(1.0, [0.25] * 4),
                                                 (0.0, [2.25 / 4, 0.75 / 4, 0.0, 0.25])])
def test_the_floors_two_ends(floor: float, expected: list[float]) -> None:
    # 1: uniform draws (random selection); 0: proportional to the masses (c never drawn)
    choice = loaded(delta_phi_floor=floor).choose(Pool(KEYS, 4, 3), Fixed((0, 1, 3, 3)),
                                                  no_ask)  # type: ignore[arg-type]
    assert choice.record is not None
    np.testing.assert_allclose([choice.record["q"][c] for c in ("a", "b", "d")],
                               [expected[0], expected[1], expected[3]])


def test_the_aggregation_is_unbiased_over_every_draw() -> None:
    # Prepare: k = 3 of the 4, equal base weights; client i's update (i + 1, (i + 1)^2) from
    # the global model (1, 1)
    selector = loaded()
    glob = {"w": np.array([1.0, 1.0])}
    updates = {c: np.array([i + 1.0, (i + 1.0) ** 2]) for i, c in enumerate(KEYS)}
    # Execute: every ordered draw through choose, weigh and the step average, by probability
    mean, total = np.zeros(2), 0.0
    for draws in itertools.product(range(4), repeat=3):
        choice = selector.choose(Pool(KEYS, 3, 5), Fixed(draws), no_ask)  # type: ignore[arg-type]
        clients = [KEYS[i] for i in choice.indices]
        w = selector.weigh(clients, np.full(len(clients), 1.0 / len(clients)))
        state = step_average([{"w": glob["w"] + updates[c]} for c in clients], w, glob)
        mean += np.prod(Q[list(draws)]) * (state["w"] - glob["w"])
        total += np.prod(Q[list(draws)])
    # Assert: the expected step is the average update over the whole pool, (2.5, 7.5)
    assert total == pytest.approx(1.0)
    np.testing.assert_allclose(mean, [2.5, 7.5], atol=1e-12)
    assert selector.step_weights()


def test_uniform_draws_of_distinct_clients_give_fedowens_weights() -> None:
    # Prepare: floor 1 over 3 clients, each drawn once; softmax-like base weights
    base = np.array([0.5, 0.3, 0.2])
    for estimator in ("unbiased", "normalised"):
        selector = loaded(delta_phi_floor=1.0, delta_estimator=estimator)
        selector.choose(Pool(("a", "b", "c"), 3, 2), Fixed((0, 1, 2)), no_ask)  # type: ignore[arg-type]
        # Execute / Assert: the importance correction is 1 for every client
        np.testing.assert_allclose(selector.weigh(["a", "b", "c"], base), base)
        assert selector.step_weights() == (estimator == "unbiased")


def test_observe_remembers_phi_as_algorithm_2s_memory() -> None:
    # Prepare / Execute: a valued round, then one not valued (phi None: nothing learned)
    selector = DeltaPhi(DeltaPhiSettings())
    selector.observe(Seen(1, ("a", "b"), np.array([0.4, -0.1])))
    selector.observe(Seen(2, ("a",), np.array([0.2])))
    selector.observe(Seen(3, ("b",), None))
    # Assert: the running mean (bandit-memory = mean)
    assert selector.state()["bandit"] == {"phi": {"a": pytest.approx(0.3), "b": -0.1},
                                          "counts": {"a": 2, "b": 1}}


def test_state_round_trip_resumes_the_same_draw() -> None:
    # Prepare
    first, rng = loaded(), np.random.default_rng(4)
    first.choose(Pool(KEYS, 3, 3), rng, no_ask)
    # Execute
    again = DeltaPhi(DeltaPhiSettings())
    again.load(json.loads(json.dumps(first.state())))
    state = rng.bit_generator.state
    a = first.choose(Pool(KEYS, 3, 4), rng, no_ask)
    rng.bit_generator.state = state
    b = again.choose(Pool(KEYS, 3, 4), rng, no_ask)
    # Assert: the same memory, the same draw and weights
    assert again.state() == json.loads(json.dumps(first.state()))
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.record is not None and b.record is not None
    assert (a.record["draws"], a.record["q"]) == (b.record["draws"], b.record["q"])
    clients = [KEYS[i] for i in a.indices]
    base = np.full(len(clients), 1.0 / len(clients))
    np.testing.assert_allclose(first.weigh(clients, base), again.weigh(clients, base))


def test_its_key_and_the_keys_it_reads() -> None:
    with pytest.raises(ValueError, match=r"delta_phi_floor=2\.0 must lie in \[0, 1\]"):
        DeltaPhiSettings(delta_phi_floor=2.0)
    cfg = parse_run_config({"selection": "delta-phi", "delta-phi-floor": 0.2,
                            "delta-estimator": "normalised", "bandit-memory": "latest"})
    assert cfg.selector_settings() == DeltaPhiSettings(
        delta_phi_floor=0.2, delta_estimator="normalised", memory="latest")
    with pytest.raises(ConfigError) as err:
        parse_run_config({"selection": "delta-phi", "delta-phi-floor": -1.0})
    (problem,) = err.value.problems
    assert problem.startswith("delta-phi-floor=-1.0 must lie in [0, 1]")


def test_four_rounds_through_fedowen(tmp_path: Path) -> None:
    # Execute: 4 rounds of 3 of the toy's 6 clients (4 and 5 move the model away)
    strategy = run_toy("owen", rounds=4, k=3, tmp_path=tmp_path, selection="delta-phi",
                       aggregation="softmax")
    # Assert: each record holds the draw; the weights are softmax(phi)'s tilt x c / (k q)
    rounds = read_rounds(tmp_path)[1:]
    for r in rounds:
        draw = r["selection"]
        assert sorted(draw["draws"]) == r["selected"] and sum(draw["draws"].values()) == 3
        for c, w in r["weights"].items():
            lam = softmax_share(r, c) * len(r["returned"]) / 6
            assert w == pytest.approx(draw["draws"][c] * lam / (3 * draw["q"][c]))
        assert r["global_weight"] == pytest.approx(1 - sum(r["weights"].values()))
    # the first draw is uniform (nothing valued), later ones follow phi, never below the floor
    qs = [list(r["selection"]["q"].values()) for r in rounds]
    assert qs[0] == pytest.approx([1 / 6] * len(qs[0]))
    assert any(max(q) > min(q) + 1e-9 for q in qs[1:])
    assert min(min(q) for q in qs) >= 0.5 / 6 - 1e-12
    memory = strategy.chooser.state()["state"]["bandit"]["phi"]
    assert {c for r in rounds[:-1] for c in r["returned"]} <= set(memory)
