"""The adaptive backdoor that knows the run's defence list (``adversary-knows = "defences"``,
issue 72): drawn towards the honest mean as little as the list's screen steps admit, on
hand-built rounds, and through the real apps, where the simulated screens predict the
strategy's own decision."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from client_app.app import app as client_app
from fedowen_task.adversary.server import EVADE_STEPS, RoundView, adaptive_backdoor, evade
from fedowen_task.config import ConfigError
from server_app.app import run
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid


def cos_with(reference: np.ndarray, least: float):
    """An ``admits`` keeping rows whose cosine with ``reference`` is at least ``least``."""
    unit = reference / np.linalg.norm(reference)
    return lambda rows: [float(r @ unit / np.linalg.norm(r)) >= least for r in rows]


def test_evade_mixes_each_row_with_its_nearest_honest_update_as_little_as_admits_allows(
        ) -> None:
    # Prepare: honest e1 and e2; two backdoored rows [0, 0, 2], a hair nearer e1; admitted at
    # cosine >= 0.8 with e1, which (1 - t) e1 + t [0, 0, 2] reaches for t <= 3/11 (by hand:
    # 0.6 (1 - t) >= 1.6 t)
    honest = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    sent = np.array([[0.0, 0.0, 2.0], [0.0, 0.0, 2.0]])
    sent[:, 0] = 1e-9  # nearer e1 than e2 (a cosine of 5e-10 against 0)
    # Execute
    out, params = evade(sent, honest, cos_with(np.array([1.0, 0.0, 0.0]), 0.8))
    # Assert: the largest t the bisection finds; both admitted, both mixed with e1
    t = params["evade_t"]
    assert 3 / 11 - 2 ** -EVADE_STEPS < t <= 3 / 11
    assert np.allclose(out, (1 - t) * honest[0] + t * sent)
    assert params["admitted"] == [True, True] and params["evade_checks"] == 2 + EVADE_STEPS


def test_where_not_all_can_pass_evade_keeps_as_many_as_the_most_mixed_round_lets_through(
        ) -> None:
    # Prepare: a filter that never keeps the second row (as a fixed-share filter may not),
    # and keeps the first at cosine >= 0.8 with e1
    honest = np.array([[1.0, 0.0, 0.0]])
    sent = np.array([[0.0, 0.0, 2.0], [0.0, 0.0, 2.0]])
    first = cos_with(honest[0], 0.8)

    def admits(rows: np.ndarray) -> list[bool]:
        return [first(rows[:1])[0], False]
    # Execute
    _, params = evade(sent, honest, admits)
    # Assert: the first admitted at the largest t that keeps it (3/11, as above)
    assert 3 / 11 - 2 ** -EVADE_STEPS < params["evade_t"] <= 3 / 11
    assert params["admitted"] == [True, False]


def test_evade_keeps_what_passes_and_stops_short_of_copying_an_honest_update() -> None:
    honest = np.array([[1.0, 0.0]])
    sent = np.array([[0.0, 3.0]])
    kept, params = evade(sent, honest, lambda rows: [True])
    assert np.array_equal(kept, sent) and params == {"evade_t": 1.0, "admitted": [True],
                                                     "evade_checks": 1}
    none, params = evade(sent, honest, lambda rows: [False])
    low = 2.0 ** -EVADE_STEPS
    assert np.allclose(none, (1 - low) * honest + low * sent) and params["evade_t"] == low
    assert params["admitted"] == [False] and params["evade_checks"] == 2


def test_the_adaptive_backdoor_evades_only_when_it_knows_the_defences() -> None:
    # Prepare: honest [1, +-0.3, 0], one backdoored update along e3, a cap of 1; the screens
    # keep updates within cosine 0.99 of the first honest one
    honest = np.array([[1.0, 0.3, 0.0], [1.0, -0.3, 0.0]])
    own = np.array([[0.0, 0.0, 2.0]])
    admits = cos_with(honest[0], 0.99)
    view = RoundView(honest, own, 3, [10], lambda examples: 1.0, admits)
    knows = parse_run_config({"adversary-fraction": 0.2, "adversary-kind": "adaptive-backdoor",
                              "adversary-knows": "defences"}).adversary()
    bounds = parse_run_config({"adversary-fraction": 0.2,
                               "adversary-kind": "adaptive-backdoor"}).adversary()
    # Execute
    evaded, params = adaptive_backdoor(view, knows)
    shaped, plain = adaptive_backdoor(view, bounds)
    # Assert: the default attacker ignores the screens; the one that knows them is admitted
    assert "evade_t" not in plain and admits(shaped) == [False]
    assert params["admitted"] == [True] and admits(evaded) == [True]
    assert 0 < params["evade_t"] < 1


def test_adversary_knows_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"adversary-knows='all' is not one of bounds, "
                                          r"defences"):
        parse_run_config({"adversary-knows": "all"})


@pytest.mark.parametrize("defence", ["alignins", "multi-metrics", "flame"])
def test_through_the_real_apps_the_simulated_screens_predict_the_strategys_decision(
        defence: str, shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: 2 of 5 clients attack, all drawn, 2 rounds, a peer's filter in the defaults' list
    listed = (f"identity norm-ratio update-bound update-filter {defence} norm-cap "
              "statistics-cap value-cap links statistics-rule robust-lr aggregate-noise")
    cfg = {"dataset": "mnist", "data-dir": str(shared_data_dir), "num-server-rounds": 2,
           "clients-per-round": 5, "client-max-samples": 20, "test-max-samples": 100,
           "adversary-fraction": 0.4, "adversary-kind": "adaptive-backdoor",
           "adversary-knows": "defences", "defences": listed, "output-dir": str(tmp_path)}
    nodes = [{"partition-id": i, "num-partitions": 5} for i in range(5)]
    # Execute
    run(InProcessGrid(client_app, nodes, cfg), parse_run_config(cfg), tmp_path)
    # Assert: in every attacked round, an attacker is rejected exactly when the attack's own
    # simulation of the list said it would be (the simulation is the strategy's screens)
    rounds = [r for r in read_rounds(tmp_path) if "attack" in r]
    assert len(rounds) == 2
    for record in rounds:
        entry = record["attack"]
        assert 0.0 <= entry["evade_t"] <= 1.0 and not math.isnan(entry["evade_t"])
        rejected = set(record.get("rejected", {}))
        assert [c not in rejected for c in entry["clients"]] == entry["admitted"], record
