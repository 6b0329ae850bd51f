"""One source of defaults: the library's FedOwen, built as the README's example builds it,
runs the game the app runs (issue 30).

The example (docs/examples/fedowen_serverapp.py) passes no valuation, selection or guard
settings; the app maps its run config onto the same types (``RunConfig.fedowen_arguments``).
With the app's default run config both must value and weight the same round the same way,
value for value.
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import ArrayRecord

from fedowen_strategy import FedOwen
from fedowen_strategy.torch_utility import CoalitionUtility
from server_app.app import build_strategy
from server_app.config import RunConfig
from sim.inline_grid import InProcessGrid
from tests.test_example_serverapp import load_example, make_client

K, SEED, NODES = 4, 7, 8


def two_rounds(strategy: FedOwen, rounds: list[dict[str, Any]], model: torch.nn.Module
               ) -> None:
    strategy.on_round = lambda r, record, rows: rounds.append(record)
    grid = InProcessGrid(make_client(load_example()),
                         [{"partition-id": i} for i in range(NODES)])
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2)


def test_the_readme_example_runs_the_apps_game_value_for_value() -> None:
    # Prepare: the example's model and server data; the library as the example uses it (no
    # settings) and the app's strategy from its default run config
    example = load_example()
    torch.manual_seed(0)
    model = example.make_model()
    x, y = example.server_data()
    cfg = RunConfig(clients_per_round=K, seed=SEED)
    library = FedOwen(clients_per_round=K, fraction_evaluate=0.0, seed=SEED,
                      utility_factory=CoalitionUtility(model, x, y))
    app = build_strategy(cfg, CoalitionUtility(model, x, y, metric=cfg.utility_metric), None)
    # Assert: the same settings, one by one
    assert library.valuation == app.valuation
    assert library.selection_params == app.selection_params
    assert library.guards == app.guards
    assert (library.selection, library.norm_cap) == (app.selection, app.norm_cap)
    assert (library.node_wait_timeout, library.query_timeout) == (
        app.node_wait_timeout, app.query_timeout)
    # Execute: two rounds each, from the same initial model
    seen: dict[str, list[dict[str, Any]]] = {"library": [], "app": []}
    two_rounds(library, seen["library"], model)
    two_rounds(app, seen["app"], model)
    # Assert: the same clients selected, the same values and weights (wall-clock aside)
    timing = ("valuation_seconds",)
    lib, ours = ([{k: v for k, v in r.items() if k not in timing} for r in seen[name]]
                 for name in ("library", "app"))
    assert len(lib) == 2 and "phi" in lib[0] and "norm_cap" in lib[0]
    assert lib == ours
