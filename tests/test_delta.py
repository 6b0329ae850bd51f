"""DELTA (:mod:`fedowen_strategy.selectors.delta`): its probabilities on the spec's hand-built
round, its aggregation's unbiasedness (exact enumeration of the draws), the step average,
the client's gradient variance, its state, and four rounds through FedOwen."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from torch import nn

from fedowen_strategy.round.aggregation import step_average, weighted_average
from fedowen_strategy.selectors.base import Pool, Seen
from fedowen_strategy.selectors.delta import Delta, DeltaSettings
from fedowen_strategy.selectors.delta_estimates import (
    delta_probabilities,
    draw_probabilities,
    fill_missing_with_median,
    gradient_diversity,
    importance_weights,
    rescale_masses,
)
from fedowen_task.protocol import GRAD_VARIANCE_FIELD, STEP_SCALE_FIELD
from fedowen_task.training import GradientMoments, step_scale, train
from server_app.store.records import read_rounds
from tests.test_strategy import run_toy, toy_handler


class Fixed:
    """A stand-in generator whose one draw is ``draws`` (DELTA's ``rng.choice``)."""

    def __init__(self, draws: tuple[int, ...]) -> None:
        self.draws = draws

    def choice(self, n: int, size: int, replace: bool, p: np.ndarray) -> np.ndarray:
        assert replace and size == len(self.draws)
        return np.array(self.draws)


def no_ask(*args: Any, **kwargs: Any) -> list[Any]:
    raise AssertionError("DELTA sends no query")


def test_probabilities_match_the_papers_formula_on_a_hand_built_round() -> None:
    # Prepare: spec 2f, a1 = a2 = 1
    zeta, sigma = np.array([1.0, 2.0, 0.0, 2.0]), np.array([1.0, 0.0, 3.0, 2.0])
    # Execute
    p = delta_probabilities(zeta, sigma)
    # Assert: sqrt terms (1.41421, 2, 3, 2.82843) over their sum 9.24264
    np.testing.assert_allclose(p, [0.15301, 0.21639, 0.32458, 0.30602], atol=5e-6)
    # a2 / a1 is what counts; all zero: uniform
    np.testing.assert_allclose(delta_probabilities(zeta, sigma, 2.0, 2.0), p)
    np.testing.assert_allclose(delta_probabilities(np.zeros(4), np.zeros(4)), [0.25] * 4)


def test_the_participants_keep_their_mass_and_the_others_theirs() -> None:
    # Prepare: spec 2f's rescale, masses 0.25 each, participants 0-2 with scores w
    w = np.array([0.65451, 0.89528, 0.80902])
    # Execute
    new = rescale_masses(np.full(3, 0.25), w)
    # Assert: 0.75 w / sum w; alone, a participant keeps its mass; no score: unchanged
    np.testing.assert_allclose(new, [0.20811, 0.28466, 0.25723], atol=5e-6)
    np.testing.assert_allclose(rescale_masses(np.array([0.25]), np.array([7.0])), [0.25])
    np.testing.assert_allclose(rescale_masses(np.array([0.1, 0.3]), np.zeros(2)), [0.1, 0.3])
    # the draw: (1 - eps) P / sum P + eps / N
    np.testing.assert_allclose(draw_probabilities(np.array([1.0, 3.0]), 0.2), [0.3, 0.7])


def test_gradient_diversity_reads_the_mean_gradient_off_the_updates() -> None:
    # Prepare: spec 2f's gradients g = (3, 0), (0, 4), (0, -1) as updates -h g, h = 2, 4, 1
    g = np.array([[3.0, 0.0], [0.0, 4.0], [0.0, -1.0]])
    h = np.array([2.0, 4.0, 1.0])
    states = [{"w": (-hi * gi).astype(np.float32), "bn.running_mean": np.ones(2)}
              for gi, hi in zip(g, h, strict=True)]
    glob = {"w": np.zeros(2, np.float32), "bn.running_mean": np.zeros(2)}
    # Execute
    zeta = gradient_diversity(states, glob, h)
    # Assert: ||g_i - (1, 1)|| = (sqrt 5, sqrt 10, sqrt 5); statistics are no gradient
    np.testing.assert_allclose(zeta, [math.sqrt(5), math.sqrt(10), math.sqrt(5)])
    np.testing.assert_allclose(fill_missing_with_median([2.0, float("nan"), 0.0, 4.0]),
                               [2, 3, 3, 4])
    np.testing.assert_allclose(fill_missing_with_median([float("nan")]), [1.0])


@pytest.mark.parametrize("k", [1, 2, 3])
def test_importance_weights_are_unbiased_by_exact_enumeration(k: int) -> None:
    # Prepare: spec 2f, N = 3, delta = (1, 2, 4), lambda = (0.5, 0.3, 0.2), p = (0.2, 0.3, 0.5)
    delta, lam, p = np.array([1.0, 2.0, 4.0]), np.array([0.5, 0.3, 0.2]), np.array([.2, .3, .5])
    # Execute: every ordered k-tuple of draws, duplicates counted once with their multiplicity
    expected = 0.0
    for draws in itertools.product(range(3), repeat=k):
        picked, counts = np.unique(draws, return_counts=True)
        w = importance_weights(lam[picked], counts, p[picked], k)
        expected += np.prod(p[list(draws)]) * float(w @ delta[picked])
    # Assert: sum lambda delta = 1.9 (k = 1: 0.2 x 2.5 + 0.3 x 2.0 + 0.5 x 1.6)
    assert expected == pytest.approx(1.9, abs=1e-12)


def test_the_selectors_aggregation_is_unbiased_over_every_draw() -> None:
    # Prepare: 4 clients with unequal masses, k = 3, equal base weights (DELTA's own setting);
    # client i's update is (i + 1, (i + 1)^2) from the global model (1, 1)
    keys = ("a", "b", "c", "d")
    glob = {"w": np.array([1.0, 1.0])}
    updates = {c: np.array([i + 1.0, (i + 1.0) ** 2]) for i, c in enumerate(keys)}
    selector = Delta(DeltaSettings(delta_floor=0.1))
    selector.load({"mass": {"a": 0.5, "b": 2.0, "c": 1.0}})  # d unseen: mass 1
    q = draw_probabilities(np.array([0.5, 2.0, 1.0, 1.0]), 0.1)
    # Execute: every ordered draw through choose, weigh and the step average, by probability
    mean = np.zeros(2)
    for draws in itertools.product(range(4), repeat=3):
        choice = selector.choose(Pool(keys, 3, 5), Fixed(draws), no_ask)  # type: ignore[arg-type]
        clients = [keys[i] for i in choice.indices]
        w = selector.weigh(clients, np.full(len(clients), 1.0 / len(clients)))
        state = step_average([{"w": glob["w"] + updates[c]} for c in clients], w, glob)
        mean += np.prod(q[list(draws)]) * (state["w"] - glob["w"])
    # Assert: the expected step is the average update over the whole pool
    np.testing.assert_allclose(mean, np.mean(list(updates.values()), axis=0), atol=1e-12)
    assert selector.step_weights()


def test_the_draw_follows_q_over_seeded_rounds() -> None:
    # Prepare: q = (0.1, 0.2, 0.3, 0.4) (masses 1:2:3:4, no floor), k = 2
    selector = Delta(DeltaSettings(delta_floor=0.0))
    selector.load({"mass": {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}})
    rng, counts, rounds = np.random.default_rng(0), np.zeros(4), 5000
    # Execute
    for _ in range(rounds):
        choice = selector.choose(Pool(("a", "b", "c", "d"), 2, 1), rng, no_ask)
        for key, c in choice.record["draws"].items():  # type: ignore[index]
            counts["abcd".index(key)] += c
    # Assert: draw shares within 4 binomial standard errors (10000 draws: at most 0.0049)
    share = counts / (2 * rounds)
    se = np.sqrt(np.array([0.1, 0.2, 0.3, 0.4]) * np.array([0.9, 0.8, 0.7, 0.6]) / (2 * rounds))
    assert np.all(np.abs(share - [0.1, 0.2, 0.3, 0.4]) < 4 * se)


def test_uniform_q_gives_the_base_aggregation_and_normalised_sums_to_one() -> None:
    # Prepare: softmax-like base weights of 3 distinct clients drawn under uniform q (N = 3)
    base = np.array([0.5, 0.3, 0.2])
    unbiased, normalised = Delta(DeltaSettings()), Delta(DeltaSettings(
        delta_estimator="normalised"))
    for sel in (unbiased, normalised):
        sel.choose(Pool(("a", "b", "c"), 3, 1), Fixed((0, 1, 2)), no_ask)  # type: ignore[arg-type]
    # Execute / Assert: FedOwen's own weights, either way
    np.testing.assert_allclose(unbiased.weigh(["a", "b", "c"], base), base)
    np.testing.assert_allclose(normalised.weigh(["a", "b", "c"], base), base)
    # a duplicate and unequal q: normalised weights sum to 1, unbiased ones need not
    for sel in (unbiased, normalised):
        sel.load({"mass": {"a": 3.0, "b": 1.0, "c": 1.0}})
        sel.choose(Pool(("a", "b", "c"), 3, 2), Fixed((0, 0, 2)), no_ask)  # type: ignore[arg-type]
    w = unbiased.weigh(["a", "c"], np.array([0.5, 0.5]))
    q_a, q_c = 0.95 * 0.6 + 0.05 / 3, 0.95 * 0.2 + 0.05 / 3
    np.testing.assert_allclose(w, [2 / (3 * 3 * q_a), 1 / (3 * 3 * q_c)])
    assert normalised.weigh(["a", "c"], np.array([0.5, 0.5])).sum() == pytest.approx(1.0)
    assert not normalised.step_weights()
    with pytest.raises(ValueError, match=r"\['b'\] were not drawn"):
        unbiased.weigh(["a", "b"], np.array([0.5, 0.5]))


def test_step_average_is_the_average_when_weights_sum_to_one_and_keeps_the_rest() -> None:
    # Prepare: two states with a statistic and a counter
    glob = {"w": np.zeros(2, np.float32), "bn.running_mean": np.zeros(1),
            "bn.num_batches_tracked": np.array(0)}
    states = [{"w": np.array([2.0, 0.0], np.float32), "bn.running_mean": np.array([1.0]),
               "bn.num_batches_tracked": np.array(4)},
              {"w": np.array([0.0, 4.0], np.float32), "bn.running_mean": np.array([3.0]),
               "bn.num_batches_tracked": np.array(8)}]
    # Execute
    avg = step_average(states, np.array([0.25, 0.75]), glob)
    step = step_average(states, np.array([0.5, 0.25]), glob)
    # Assert: = weighted_average at sum 1; else global + sum w delta, buffers normalised
    for key, value in weighted_average(states, np.array([0.25, 0.75])).items():
        np.testing.assert_allclose(avg[key], value)
    np.testing.assert_allclose(step["w"], [1.0, 1.0])
    assert step["w"].dtype == np.float32
    np.testing.assert_allclose(step["bn.running_mean"], [(2 * 1.0 + 3.0) / 3])
    assert int(step["bn.num_batches_tracked"]) == 5  # (2 x 4 + 8) / 3 = 5.33, rounded


def test_gradient_moments_on_hand_set_gradients() -> None:
    # Prepare: one parameter of 2, gradients (1, 0) then (3, 2)
    model = nn.Linear(2, 1, bias=False)
    moments = GradientMoments(model)
    for g in ([1.0, 0.0], [3.0, 2.0]):
        model.weight.grad = torch.tensor([g])
        moments.add()
    # Assert: mean ||g||^2 = (1 + 13) / 2 = 7, ||mean g||^2 = ||(2, 1)||^2 = 5
    assert moments.variance() == pytest.approx(2.0)
    assert moments.steps == 2


def ce_gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mean cross-entropy gradient of a bias-free linear model ``logits = x w^T``:
    ``mean_s (softmax(w x_s) - e_{y_s}) x_s^T``."""
    z = x @ w.T
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p.T @ x / len(y)


def test_train_reports_the_variance_of_its_hand_computed_steps() -> None:
    # Prepare: a zero 2 x 2 linear model, 3 samples, one full batch per epoch, 2 epochs,
    # plain SGD: steps at w0 = 0 and w1 = -lr g1
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 1])
    lr = 0.5
    g1 = ce_gradient(np.zeros((2, 2)), x.numpy(), y.numpy())
    g2 = ce_gradient(-lr * g1, x.numpy(), y.numpy())
    models = [nn.Linear(2, 2, bias=False) for _ in range(2)]
    for m in models:
        nn.init.zeros_(m.weight)
    kwargs = {"epochs": 2, "lr": lr, "momentum": 0.0, "batch_size": 3, "seed": 0}
    # Execute
    stats = train(models[0], x, y, grad_variance=True, **kwargs)  # type: ignore[arg-type]
    plain = train(models[1], x, y, **kwargs)  # type: ignore[arg-type]
    # Assert: (||g1||^2 + ||g2||^2) / 2 - ||(g1 + g2) / 2||^2 = ||g1 - g2||^2 / 4
    assert stats["grad_variance"] == pytest.approx(float(((g1 - g2) ** 2).sum()) / 4, rel=1e-5)
    assert stats["step_scale"] == pytest.approx(lr * 2)
    # training is unchanged
    assert torch.equal(models[0].weight, models[1].weight) and "grad_variance" not in plain
    assert plain["step_scale"] == pytest.approx(lr * 2)  # reported without the variance too


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("steps", [1, 2, 3, 10, 60])
def test_step_scale_is_how_far_torchs_sgd_moves_under_a_unit_gradient(momentum: float,
                                                                       steps: int) -> None:
    # Prepare: a parameter whose loss is its sum (gradient 1), a fresh optimizer as a round's
    w = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    optimizer = torch.optim.SGD([w], lr=0.05, momentum=momentum)
    # Execute
    for _ in range(steps):
        optimizer.zero_grad()
        w.sum().backward()
        optimizer.step()
    # Assert: the momentum's warm-up included (one step moves lr, not lr / (1 - m))
    assert step_scale(0.05, momentum, steps) == pytest.approx(-float(w), rel=1e-12)
    assert step_scale(0.05, momentum, 1) == pytest.approx(0.05)


def with_variance(msg: Message, ctx: Context) -> Message:
    """The toy client, reporting a variance (its id) and a step scale 1 when asked."""
    reply = toy_handler(msg, ctx)
    config = msg.content.config_records.get("config")
    if msg.metadata.message_type == "train" and config and config.get(GRAD_VARIANCE_FIELD):
        pid = int(ctx.node_config["partition-id"])
        reply.content["delta"] = MetricRecord({GRAD_VARIANCE_FIELD: float(pid ** 2),
                                               STEP_SCALE_FIELD: 1.0})
    return reply


@pytest.mark.parametrize("method, aggregation", [("none", "uniform"), ("owen", "softmax")])
def test_four_rounds_through_fedowen(method: str, aggregation: str, tmp_path: Path) -> None:
    # Execute: 4 rounds of 3 of the toy's 6 clients
    strategy = run_toy(method, rounds=4, k=3, tmp_path=tmp_path, selection="delta",
                       aggregation=aggregation, handler=with_variance)
    # Assert: each round's record holds the draw; the weights are c lambda / (k q)
    rounds = read_rounds(tmp_path)[1:]
    for r in rounds:
        draw = r["selection"]
        assert sorted(draw["draws"]) == r["selected"] and sum(draw["draws"].values()) == 3
        base = 1 / len(r["returned"]) if aggregation == "uniform" else None
        for c, w in r["weights"].items():
            lam = (base if base is not None else softmax_share(r, c)) * len(r["returned"]) / 6
            assert w == pytest.approx(draw["draws"][c] * lam / (3 * draw["q"][c]))
        assert r["global_weight"] == pytest.approx(1 - sum(r["weights"].values()))
        assert draw["extra_messages"] == 0  # its estimates ride on the train replies
        assert draw["selector_seconds"] >= 0
    # the clients' variances reached the estimates (sigma = the id), and the masses moved
    assert rounds[-1]["selection"]["estimates"]
    for c, e in rounds[-1]["selection"]["estimates"].items():
        assert e["sigma"] == pytest.approx(float(c[1:]))
    mass = strategy.chooser.state()["state"]["mass"]
    assert len(set(mass.values())) > 1
    assert np.all(np.isfinite(record_distance(strategy)))


def softmax_share(record: dict[str, Any], client: str) -> float:
    """The valuation's softmax(phi) weight of ``client`` (temperature 1)."""
    phi = np.array(list(record["phi"].values()))
    z = np.exp(phi - phi.max())
    return float(z[list(record["phi"]).index(client)] / z.sum())


def record_distance(strategy: Any) -> list[float]:
    return [m["distance"] for m in strategy.result.evaluate_metrics_serverapp.values()]


def test_state_round_trip_resumes_the_same_draw() -> None:
    # Prepare: three rounds, then the state as a checkpoint keeps it
    first = run_toy("none", rounds=3, k=3, selection="delta", aggregation="uniform",
                    handler=with_variance)
    state = json.loads(json.dumps(first.state_dict()))
    # Execute: a fresh strategy loads it
    again = run_toy("none", rounds=0, k=3, selection="delta", aggregation="uniform")
    again.load_state_dict(state)
    # Assert: the same memory, the same next draw
    assert again.chooser.state() == first.chooser.state()
    keys = [f"c{i}" for i in range(6)]
    a, b = again.chooser.choose(keys, 4, 3), first.chooser.choose(keys, 4, 3)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.record["draws"] == b.record["draws"]  # type: ignore[index]


def test_observe_without_estimates_keeps_unseen_clients_at_the_mean_mass() -> None:
    # Prepare: one round of two clients, updates (1, 0) and (-1, 0), no metrics
    selector = Delta(DeltaSettings(delta_sigma_weight=0.0))
    glob = {"w": np.zeros(2)}
    # Execute
    selector.observe(Seen(1, ("a", "b"), None, (RecordDict(), RecordDict()),
                          ({"w": np.array([1.0, 0.0])}, {"w": np.array([-1.0, 0.0])}), glob))
    # Assert: equal diversity (1 each): the two keep their mass 1 each; an unseen one has 1
    assert selector.state()["mass"] == {"a": 1.0, "b": 1.0}
    assert selector.state()["last"]["a"] == {"zeta": 1.0, "sigma": 0.0}
    with pytest.raises(ValueError, match=r"delta_floor=2\.0 must lie in \[0, 1\]"):
        DeltaSettings(delta_floor=2.0)
    with pytest.raises(ValueError, match="delta_estimator='biased' is not one of"):
        DeltaSettings(delta_estimator="biased")


def test_the_real_apps_report_the_variance_delta_asks_for(shared_data_dir: Path,
                                                          tmp_path: Path) -> None:
    # Prepare: MNIST, 6 clients of 100 examples, 3 draws a round, equal weights
    from client_app.app import app as client_app
    from server_app.app import run
    from server_app.config import parse_run_config
    from sim.inline_grid import InProcessGrid

    run_config = {"dataset": "mnist", "data-dir": str(shared_data_dir),
                  "output-dir": str(tmp_path), "num-server-rounds": 2, "clients-per-round": 3,
                  "client-max-samples": 100, "test-max-samples": 300, "alpha": 10.0,
                  "imbalance-factor": 1.0, "valuation": "none", "aggregation": "uniform",
                  "selection": "delta"}
    nodes = [{"partition-id": i, "num-partitions": 6} for i in range(6)]
    # Execute
    run(InProcessGrid(client_app, nodes, run_config), parse_run_config(run_config), tmp_path)
    # Assert: round 2's record holds round 1's estimates, a positive sigma for every trainer;
    # the weights are c / (k N q) (lambda = 1/N)
    first, second = read_rounds(tmp_path)[1:]
    estimates = second["selection"]["estimates"]
    assert sorted(estimates) == first["returned"]
    assert all(e["sigma"] > 0 and e["zeta"] > 0 for e in estimates.values())
    for r in (first, second):
        draw = r["selection"]
        for c, w in r["weights"].items():
            assert w == pytest.approx(draw["draws"][c] / (3 * 6 * draw["q"][c]))
