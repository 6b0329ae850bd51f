"""FLAME whole as a defence (issue 72, deliver 2): :mod:`fedowen_strategy.defences.flame` on
hand-built rounds, inside FedOwen's list and its round, and around Flower's FedAvg."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedowen_strategy.defences import table
from fedowen_strategy.defences.base import RoundView, Settling
from fedowen_strategy.defences.defended import Defended
from fedowen_strategy.defences.flame import Flame, add_noise
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.guards import guard_round
from fedowen_strategy.replies import ClientUpdate, ParsedReplies
from fedowen_strategy.round.contribution import ValuationSettings
from fedowen_strategy.round.round_step import aggregate_round
from server_app.config import parse_run_config
from tests import peer_rounds
from tests.peer_rounds import BASE, GLOBAL


def at(degrees: float, norm: float) -> np.ndarray:
    """An update of ``norm`` at ``degrees`` in the plane of the first two coordinates."""
    angle = math.radians(degrees)
    return np.array([norm * math.cos(angle), norm * math.sin(angle), 0.0, 0.0], np.float32)


#: c1..c4 at 0, 1, 2, 3 degrees (norms 5, 1, 2, 3), c5 honest but 7 degrees off c4 (norm 4);
#: c6, c7 parallel attackers at 100 degrees, boosted (norms 10, 20)
ROUND = [(0, 5), (1, 1), (2, 2), (3, 3), (10, 4), (100, 10), (100, 20)]


def round_deltas() -> list[np.ndarray]:
    """The updates of :data:`ROUND`."""
    return [at(d, n) for d, n in ROUND]


def admitted_mean() -> np.ndarray:
    """By hand: c1..c4 averaged with equal weights, c1 clipped from 5 to the median of all
    seven norms (1 2 3 4 5 10 20: 4)."""
    return (at(0, 4) + at(1, 1) + at(2, 2) + at(3, 3)) / 4


def updates_of(deltas: list[np.ndarray]) -> list[ClientUpdate]:
    return [ClientUpdate(i, f"c{i + 1}", {"w": GLOBAL["w"] + d}, 10, 0.0)
            for i, d in enumerate(deltas)]



def around_fedavg(guards: Guards, seed: int = 0) -> tuple[Defended, np.ndarray]:
    """FedAvg wrapped in ``flame`` after one round over :func:`round_deltas`; its aggregate."""
    return peer_rounds.around_fedavg("flame", guards, round_deltas(), seed=seed)


def settle_once(state: dict[str, np.ndarray], level: float, clip_norm: float, seed: int
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Flame's settle step alone on ``state``, its screen having recorded ``clip_norm``."""
    view = RoundView(state, Guards(flame_lambda=level))
    settling = Settling(view, [state], ["c1"], np.ones(1), np.random.default_rng(seed),
                        {"flame": {"clip_norm": clip_norm}})
    out, record = Flame().settle(dict(state), settling)
    return out, record


def test_the_parallel_minority_is_left_out_and_the_rest_clipped_to_the_median_of_all() -> None:
    # Prepare: 7 updates, min cluster size 7 // 2 + 1 = 4, min_samples 1 (single linkage on
    # cosine distances): c1..c4 join within 1 - cos(1 deg) = 1.5e-4, c5 at 1 - cos(7 deg) =
    # 7.5e-3, the attackers (at 0 of each other) at 1 - cos(90 deg) = 1. Two clusters of 4
    # cannot form among 7, so the one cluster is the root, and HDBSCAN labels it with the
    # points still in it when it falls below 4: c1..c4. c5, c6, c7 fell out before: noise
    listed = table.build("identity norm-ratio flame", fedowen=True)
    # Execute
    out = guard_round(updates_of(round_deltas()), GLOBAL, Guards(), norm_cap="none",
                      value_players=True, defences=listed)
    # Assert: the bound is the median of all seven norms (4), not of the admitted four
    # (2.5): c1 alone is clipped, by 4/5
    assert list(out.rejected) == ["c5", "c6", "c7"]
    assert "FLAME: outside the largest HDBSCAN cluster" in out.rejected["c6"]
    assert "(noise; 4 of 7 admitted, min cluster size 4)" in out.rejected["c7"]
    record = out.record["flame"]
    assert record["label"] == {"c1": 0, "c2": 0, "c3": 0, "c4": 0, "c5": -1, "c6": -1, "c7": -1}
    assert record["clip_norm"] == pytest.approx(4.0, rel=1e-6)
    assert record["norm"]["c7"] == pytest.approx(20.0, rel=1e-6)
    assert record["admitted"] == 4
    assert out.clipped == {"c1": pytest.approx(0.8)}
    assert [u.client_id for u in out.updates] == ["c1", "c2", "c3", "c4"]
    for upd, (degrees, norm) in zip(out.updates, [(0, 4), (1, 1), (2, 2), (3, 3)], strict=True):
        np.testing.assert_allclose(upd.state["w"] - GLOBAL["w"], at(degrees, norm), atol=1e-6)
    assert out.updates[0].norm is None and out.updates[1].norm == pytest.approx(1.0)


def test_tied_distances_admit_all_and_two_updates_are_not_clustered() -> None:
    # Prepare: three orthogonal updates (every distance exactly 1: the root splits into
    # singletons at once, all still in it), norms 1, 2, 4; then two updates alone (fewer
    # than 3: no clustering), norms |BASE| and 20 |BASE|
    orthogonal = updates_of([np.eye(4, dtype=np.float32)[i] * n for i, n in enumerate((1, 2, 4))])
    pair = updates_of([BASE, 20 * BASE])
    # Execute
    three = guard_round(orthogonal, GLOBAL, Guards(), norm_cap="none", value_players=False,
                        defences=[Flame()])
    two = guard_round(pair, GLOBAL, Guards(), norm_cap="none", value_players=False,
                      defences=[Flame()])
    # Assert: all admitted; the median of (1, 2, 4) is 2 (c3 clipped by 1/2); of the pair's
    # norms 10.5 |BASE| (c2 clipped by 10.5 / 20)
    assert three.rejected == {} and three.clipped == {"c3": pytest.approx(0.5)}
    assert three.record["flame"]["label"] == {"c1": 0, "c2": 0, "c3": 0}
    assert two.rejected == {} and two.clipped == {"c2": pytest.approx(10.5 / 20)}
    assert two.record["flame"]["clip_norm"] == pytest.approx(
        10.5 * float(np.linalg.norm(BASE)), rel=1e-6)


def test_the_noise_is_lambda_times_the_bound_on_parameters_only_and_seeded() -> None:
    # Prepare: an aggregate of 20000 weights and a BatchNorm layer (weight, statistics, counter)
    state: dict[str, np.ndarray] = {
        "w": np.zeros(20000, np.float32), "bn.weight": np.ones(3, np.float32),
        "bn.running_mean": np.full(3, 0.5, np.float32),
        "bn.running_var": np.full(3, 2.0, np.float32),
        "bn.num_batches_tracked": np.array(7, np.int64)}
    # Execute: lambda 0.5 at bound 2: sigma 1
    out, record = settle_once(state, 0.5, 2.0, seed=3)
    again, _ = settle_once(state, 0.5, 2.0, seed=3)
    other, _ = settle_once(state, 0.5, 2.0, seed=4)
    off, off_record = settle_once(state, 0.0, 2.0, seed=3)
    # Assert: sigma = lambda x S_t; the parameters moved by N(0, 1) (mean 0, std 1 within 3%
    # on 20000 draws), the statistics and the counter not at all; one seed, one draw
    assert record == {"flame_noise_std": pytest.approx(1.0)}
    assert abs(float(out["w"].mean())) < 0.03
    assert float(out["w"].std()) == pytest.approx(1.0, rel=0.03)
    assert out["w"].dtype == np.float32
    assert not np.array_equal(out["bn.weight"], state["bn.weight"])
    for key in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        np.testing.assert_array_equal(out[key], state[key])
        assert out[key].dtype == state[key].dtype
    np.testing.assert_array_equal(out["w"], again["w"])
    assert not np.array_equal(out["w"], other["w"])
    assert off_record == {"flame_noise_std": 0.0}
    assert all(np.array_equal(off[k], state[k]) for k in state)


def test_no_noise_draws_nothing_from_the_generator() -> None:
    # Prepare
    rng = np.random.default_rng(0)
    # Execute
    add_noise({"w": np.zeros(3)}, {"w": np.zeros(3)}, 2.0, 0.0, rng)
    # Assert: the stream is where a fresh one starts
    assert rng.random() == np.random.default_rng(0).random()


def test_around_flowers_fedavg_the_round_is_filtered_clipped_and_noised() -> None:
    # Prepare: the round of the first test as replies, at lambda 0 (no noise) and 0.001
    # Execute
    plain, plain_w = around_fedavg(Guards(flame_lambda=0.0))
    noisy, noisy_w = around_fedavg(Guards(), seed=5)
    _, same_w = around_fedavg(Guards(), seed=5)
    _, other_w = around_fedavg(Guards(), seed=6)
    # Assert: FedAvg (equal examples) averages the four admitted, c1 clipped; the noise's
    # sigma is 0.001 x 4 (no coordinate of 4 moved by 5 sigma); seeded by the wrapper's seed
    np.testing.assert_allclose(plain_w - GLOBAL["w"], admitted_mean(), atol=1e-6)
    assert list(plain.round_record["rejected"]) == ["c5", "c6", "c7"]
    assert plain.round_record["clipped"] == {"c1": pytest.approx(0.8)}
    assert plain.round_record["flame"]["admitted"] == 4
    assert plain.round_record["flame_noise_std"] == 0.0
    assert noisy.round_record["flame_noise_std"] == pytest.approx(0.004, rel=1e-6)
    assert 0 < np.abs(noisy_w - plain_w).max() < 5 * 0.004
    np.testing.assert_array_equal(noisy_w, same_w)
    assert not np.array_equal(noisy_w, other_w)


def test_inside_fedowens_round_the_valued_average_is_noised_after() -> None:
    # Prepare: the round of the first test through FedOwen's round (no valuation: uniform)
    parsed = ParsedReplies(updates=updates_of(round_deltas()))
    # Execute
    out = aggregate_round(
        parsed, GLOBAL, selected=[f"c{i}" for i in range(1, 8)],
        valuation=ValuationSettings(method="none", aggregation="uniform"),
        guards=Guards(flame_lambda=0.0), norm_cap="none", utility_factory=None,
        rng=np.random.default_rng(0), server_round=1,
        defences=table.build("identity norm-ratio flame", fedowen=True))
    # Assert: the same decision and average as around FedAvg; recorded in the round record
    assert sorted(out.record["rejected"]) == ["c5", "c6", "c7"]
    assert out.record["flame"]["clip_norm"] == pytest.approx(4.0, rel=1e-6)
    assert out.record["flame_noise_std"] == 0.0 and out.state is not None
    np.testing.assert_allclose(out.state["w"] - GLOBAL["w"], admitted_mean(), atol=1e-6)


def test_the_settle_step_without_its_screen_says_what_is_missing() -> None:
    # Prepare
    state = {"w": np.zeros(2)}
    settling = Settling(RoundView(state), [state], ["c1"], np.ones(1),
                        np.random.default_rng(0))
    # Execute / Assert
    with pytest.raises(ValueError, match=r"clip bound its screen recorded"):
        Flame().settle(state, settling)


def test_the_run_config_takes_flame_and_names_a_bad_lambda() -> None:
    # Execute
    cfg = parse_run_config({"defences": "identity norm-ratio flame norm-cap",
                            "flame-lambda": 0.01})
    # Assert: listed by name (in no auto list, the default list unchanged); a bad value is
    # one message naming the key
    assert cfg.fedowen_arguments()["defences"].split()[2] == "flame"
    assert "flame" not in table.FEDOWEN_DEFENCES + table.FLOWER_DEFENCES
    assert table.DEFENCES["flame"].keys == ("flame-lambda",)
    assert Guards().flame_lambda == 0.001
    for bad in (-0.001, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"flame-lambda=.* must be finite and >= 0"):
            parse_run_config({"flame-lambda": bad})
    with pytest.raises(ValueError, match=r"'flamee' is not a defence \(did you mean 'flame'"):
        parse_run_config({"defences": "identity flamee"})
