"""DELTA as its public code does it (``delta-score = "code"``, ``delta-draw = "without"``;
:mod:`fedowen_strategy.selectors.delta_code`): the code's score on a hand-built round, the draw
without replacement against its inclusion probabilities, the code's weights and their bias by
exact enumeration, today's draws under the default keys (pinned), and four rounds through
FedOwen."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, MetricRecord, RecordDict

from fedowen_strategy.round.aggregation import step_average
from fedowen_strategy.selectors.base import Pool, Seen
from fedowen_strategy.selectors.delta import Delta, DeltaSettings
from fedowen_strategy.selectors.delta_code import code_scores, draw_without_replacement
from fedowen_strategy.selectors.delta_estimates import gradient_spread
from fedowen_task.protocol import GRAD_VARIANCE_FIELD, STEP_SCALE_FIELD
from server_app.store.records import read_rounds
from tests.test_strategy import run_toy, toy_handler

CODE = {"delta_score": "code", "delta_draw": "without"}


class Ordered:
    """A stand-in generator whose one draw without replacement is ``draws``, in order."""

    def __init__(self, draws: tuple[int, ...]) -> None:
        self.draws = draws

    def choice(self, n: int, size: int, replace: bool, p: np.ndarray) -> np.ndarray:
        assert not replace and size == len(self.draws)
        return np.array(self.draws)


def no_ask(*args: Any, **kwargs: Any) -> list[Any]:
    raise AssertionError("DELTA sends no query")


def reply(**metrics: float) -> RecordDict:
    return RecordDict({"metrics": MetricRecord(dict(metrics))})


def test_the_codes_score_on_a_hand_built_round() -> None:
    # Prepare: gradients g = (3, 0), (0, 4), (0, -1) sent as updates -h g with h = 2, 4, 1;
    # num-examples 10, 20, 30; old masses 0.5, 1, 2 (they keep their total, 3.5)
    g = np.array([[3.0, 0.0], [0.0, 4.0], [0.0, -1.0]])
    h = np.array([2.0, 4.0, 1.0])
    glob = {"w": np.zeros(2)}
    states = tuple({"w": -hi * gi} for gi, hi in zip(g, h, strict=True))
    replies = tuple(reply(**{STEP_SCALE_FIELD: hi, "num-examples": n})
                    for hi, n in zip(h, (10, 20, 30), strict=True))
    selector = Delta(DeltaSettings(**CODE))
    selector.load({"mass": {"a": 0.5, "b": 1.0, "c": 2.0}})
    # Execute
    norms, zeta = gradient_spread(states, glob, h)
    selector.observe(Seen(1, ("a", "b", "c"), None, replies, states, glob))
    # Assert: ||g|| = (3, 4, 1), g_bar = (1, 1), zeta = (sqrt 5, sqrt 10, sqrt 5);
    # s = n (||g|| + zeta) / 2 = (15 + 5 sqrt 5, 40 + 10 sqrt 10, 15 + 15 sqrt 5)
    np.testing.assert_allclose(norms, [3.0, 4.0, 1.0])
    np.testing.assert_allclose(zeta, [math.sqrt(5), math.sqrt(10), math.sqrt(5)])
    s = np.array([15 + 5 * math.sqrt(5), 40 + 10 * math.sqrt(10), 15 + 15 * math.sqrt(5)])
    np.testing.assert_allclose(code_scores(norms, zeta, np.array([10.0, 20.0, 30.0])), s)
    mass = selector.state()["mass"]
    np.testing.assert_allclose([mass["a"], mass["b"], mass["c"]], 3.5 * s / s.sum())
    assert selector.state()["last"]["b"] == pytest.approx({"zeta": math.sqrt(10), "norm": 4.0})
    # no variance term: the clients are asked for their step scale only
    assert selector.train_config() == {STEP_SCALE_FIELD: 1}
    assert Delta(DeltaSettings()).train_config() == {GRAD_VARIANCE_FIELD: 1}


def test_the_draw_without_replacement_gives_k_distinct_clients_by_successive_sampling() -> None:
    # Prepare: q = (0.1, 0.2, 0.3, 0.4) (masses 1:2:3:4, no floor), k = 2; client i is in the
    # pair with pi_i = q_i + sum_{j != i} q_j q_i / (1 - q_j)
    selector = Delta(DeltaSettings(delta_floor=0.0, delta_draw="without"))
    selector.load({"mass": {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}})
    pi = np.array([1 / 10 + 1 / 40 + 3 / 70 + 1 / 15, 1 / 5 + 1 / 45 + 3 / 35 + 2 / 15,
                   3 / 10 + 1 / 30 + 3 / 40 + 1 / 5, 2 / 5 + 2 / 45 + 1 / 10 + 6 / 35])
    rng, counts, rounds = np.random.default_rng(0), np.zeros(4), 5000
    # Execute
    for _ in range(rounds):
        choice = selector.choose(Pool(("a", "b", "c", "d"), 2, 1), rng, no_ask)
        # Assert: two distinct clients every round, each drawn once
        assert choice.indices.size == 2 and choice.indices[0] < choice.indices[1]
        assert choice.record["draws"] == {"abcd"[i]: 1 for i in choice.indices}  # type: ignore[index]
        counts[choice.indices] += 1
    # Assert: pi = (0.23452, 0.44127, 0.60833, 0.71587), sum 2; shares within 4 standard errors
    assert pi.sum() == pytest.approx(2.0)
    assert np.all(np.abs(counts / rounds - pi) < 4 * np.sqrt(pi * (1 - pi) / rounds))
    # fewer than k clients with q > 0: all of them
    q = np.array([0.5, 0.5, 0.0, 0.0])
    np.testing.assert_array_equal(draw_without_replacement(q, 3, np.random.default_rng(1)),
                                  [0, 1])


def test_the_codes_weights_are_b_over_N_q_and_biased_unless_q_is_uniform() -> None:
    # Prepare: 3 clients, q = p = (0.2, 0.3, 0.5) (masses, no floor), k = 2, equal base
    # weights 1/2; updates delta = (1, 2, 4) from the global model 0
    keys, delta = ("a", "b", "c"), np.array([1.0, 2.0, 4.0])
    glob = {"w": np.zeros(1)}

    def expected_step(p: tuple[float, float, float]) -> float:
        selector = Delta(DeltaSettings(delta_floor=0.0, **CODE))
        selector.load({"mass": dict(zip(keys, p, strict=True))})
        mean = 0.0
        for i, j in itertools.permutations(range(3), 2):  # every ordered draw of 2
            choice = selector.choose(Pool(keys, 2, 1), Ordered((i, j)), no_ask)  # type: ignore[arg-type]
            clients = [keys[c] for c in choice.indices]
            w = selector.weigh(clients, np.array([0.5, 0.5]))
            state = step_average([{"w": np.array([delta[keys.index(c)]])} for c in clients],
                                 w, glob)
            mean += p[i] * p[j] / (1 - p[i]) * float(state["w"][0])
        return mean

    selector = Delta(DeltaSettings(delta_floor=0.0, **CODE))
    selector.load({"mass": {"a": 0.2, "b": 0.3, "c": 0.5}})
    selector.choose(Pool(keys, 2, 1), Ordered((2, 0)), no_ask)  # type: ignore[arg-type]
    # Execute
    w = selector.weigh(["a", "c"], np.array([0.5, 0.5]))
    biased, uniform = expected_step((0.2, 0.3, 0.5)), expected_step((1 / 3, 1 / 3, 1 / 3))
    # Assert: w = b / (N q) = (0.5 / 0.6, 0.5 / 1.5), a step (the global model keeps the rest)
    np.testing.assert_allclose(w, [0.5 / 0.6, 0.5 / 1.5])
    assert selector.step_weights()
    # E = sum pi_i delta_i / (N k p_i), pi = (17/35, 27/40, 47/56): 17/42 + 3/4 + 47/42 =
    # 191/84, not the mean 7/3 = 196/84; with uniform q, pi = 2/3 = k q: unbiased
    assert biased == pytest.approx(191 / 84, abs=1e-12)
    assert uniform == pytest.approx(7 / 3, abs=1e-12)


#: Today's DELTA (paper score, draws with replacement) on :func:`scripted`, recorded at
#: 7b4f3d0 (before the code's keys existed) to full precision: round by round the drawn
#: indices, their counts and the weights, and the masses after round 5.
PINNED_DRAWS = [([3, 4, 5], [1, 1, 1]), ([1, 5], [2, 1]), ([0, 5], [1, 2]), ([2, 3], [2, 1]),
                ([1, 3], [1, 2])]
PINNED_WEIGHTS = [[1 / 3] * 3, [2 / 3, 0.3017527769714809], [1 / 3, 0.5047057582483807],
                  [2 / 3, 0.3766160733271079], [0.4253027542078472, 0.6519897699458866]]
PINNED_MASS = {"c0": 0.7955144385645817, "c1": 0.6875035940770216, "c2": 0.8553302138984777,
               "c3": 1.1085662356661135, "c4": 1.0108087503539782, "c5": 1.5422767674398274}


def scripted(selector: Delta) -> list[tuple[list[int], list[int], list[float]]]:
    """Five seeded rounds of 3 draws from 6 clients: choose, weigh (equal base weights),
    observe client i's update (i + 1, (-1)^i, round) with step scale 2, variance i."""
    keys, rng, glob = tuple(f"c{i}" for i in range(6)), np.random.default_rng(7), np.zeros(3)
    out = []
    for r in range(1, 6):
        choice = selector.choose(Pool(keys, 3, r), rng, no_ask)
        clients = [keys[i] for i in choice.indices]
        w = selector.weigh(clients, np.full(len(clients), 1.0 / len(clients)))
        ids = choice.indices.tolist()
        states = tuple({"w": glob + np.array([i + 1.0, (-1.0) ** i, r])} for i in ids)
        replies = tuple(reply(**{GRAD_VARIANCE_FIELD: float(i), STEP_SCALE_FIELD: 2.0,
                                 "num-examples": 10 + i}) for i in ids)
        selector.observe(Seen(r, tuple(clients), None, replies, states, {"w": glob}))
        draws = choice.record["draws"]  # type: ignore[index]
        out.append((ids, [draws[c] for c in clients], w.tolist()))
    return out


@pytest.mark.parametrize("settings", [DeltaSettings(), DeltaSettings(
    delta_score="paper", delta_draw="with-replacement")])
def test_the_default_keys_draw_and_weigh_as_before(settings: DeltaSettings) -> None:
    # Execute
    selector = Delta(settings)
    out = scripted(selector)
    # Assert: the recorded draws (duplicates among them), weights and masses
    assert [(ids, counts) for ids, counts, _ in out] == PINNED_DRAWS
    assert [w for _, _, w in out] == PINNED_WEIGHTS
    assert selector.state()["mass"] == PINNED_MASS
    with pytest.raises(ValueError, match="delta_draw='with' is not one of"):
        DeltaSettings(delta_draw="with")


def with_step_scale(msg: Message, ctx: Context) -> Message:
    """The toy client (num-examples 10 + id), reporting a step scale 1 when asked, and
    failing if asked for a variance (the code's score has none)."""
    config = msg.content.config_records.get("config")
    reply_msg = toy_handler(msg, ctx)
    if msg.metadata.message_type == "train" and config:
        assert not config.get(GRAD_VARIANCE_FIELD)
        if config.get(STEP_SCALE_FIELD):
            reply_msg.content["delta"] = MetricRecord({STEP_SCALE_FIELD: 1.0})
    return reply_msg


def test_four_rounds_through_fedowen_as_the_code(tmp_path: Path) -> None:
    # Execute: 4 rounds of 3 of the toy's 6 clients, equal base weights, the code's keys
    strategy = run_toy("none", rounds=4, k=3, tmp_path=tmp_path, aggregation="uniform",
                       selection=DeltaSettings(**CODE), handler=with_step_scale)
    # Assert: 3 distinct clients a round, each drawn once; weights (1/m) / (N q)
    rounds = read_rounds(tmp_path)[1:]
    assert len(rounds) == 4
    for r in rounds:
        draw = r["selection"]
        assert sorted(draw["draws"]) == r["selected"] == r["returned"]
        assert len(r["selected"]) == 3
        assert set(draw["draws"].values()) == {1}
        for c, w in r["weights"].items():
            assert w == pytest.approx(1 / len(r["returned"]) / (6 * draw["q"][c]))
        assert r["global_weight"] == pytest.approx(1 - sum(r["weights"].values()))
    # the previous round's norms and diversities reached the record, and the masses moved
    for e in rounds[-1]["selection"]["estimates"].values():
        assert set(e) == {"zeta", "norm"} and e["norm"] > 0
    mass = strategy.chooser.state()["state"]["mass"]
    assert len(set(mass.values())) > 1
    distances = [m["distance"] for m in strategy.result.evaluate_metrics_serverapp.values()]
    assert np.all(np.isfinite(distances))
