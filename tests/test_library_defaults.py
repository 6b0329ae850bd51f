"""One source of defaults: every default of the library is the app's (pyproject.toml), and
the library's FedOwen, built as the README's example builds it, runs the game the app runs
(issues 30, 44).

The example (docs/examples/fedowen_serverapp.py) passes no valuation, selection or guard
settings; the app maps its run config onto the same types (``RunConfig.fedowen_arguments``).
With the app's default run config both must value and weight the same round the same way,
value for value.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAvg

from fedowen_strategy import FedOwen, Guards, SelectionParams, ValuationSettings
from fedowen_strategy.selectors import registry
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_task.config import parse_params
from fedowen_task.recipe import TrainConfig
from server_app.config import SETTINGS_KEYS, RunConfig
from server_app.factory import build_strategy
from sim.inline_grid import InProcessGrid
from tests.test_behaviour_guard import without_seconds
from tests.test_config import pyproject_defaults
from tests.test_example_serverapp import load_example, make_client

K, SEED, NODES = 4, 7, 8
#: FedOwen's own arguments that are run-config keys.
FEDOWEN_KEYS = {"selection": "selection", "seed": "seed", "fraction_evaluate": "fraction-evaluate",
                "node_wait_timeout": "node-wait-timeout", "query_timeout": "round-timeout",
                "defences": "defences"}
#: FedOwen's own arguments that are not: settings types (compared field by field), a callable
#: and hooks, and k, whose library default None keeps FedAvg's fraction_train rule (the app
#: always sets clients-per-round).
FEDOWEN_NOT_KEYS = {"valuation", "selection_params", "guards", "utility_factory", "server_step",
                    "on_round", "on_evaluate", "clients_per_round"}


def field_default(spec: dataclasses.Field[Any]) -> Any:
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def test_every_library_default_is_the_apps_key_by_key() -> None:
    # Prepare: the app's defaults, and FedOwen's own arguments (FedAvg's are Flower's)
    app = pyproject_defaults()
    own = inspect.signature(FedOwen).parameters
    fedavg = inspect.signature(FedAvg).parameters
    assert {n for n in own if n not in fedavg or n in FEDOWEN_KEYS} == (
        set(FEDOWEN_KEYS) | FEDOWEN_NOT_KEYS)
    # Execute: each library default beside its key's
    pairs = [(f"FedOwen({name})", own[name].default, app[key])
             for name, key in FEDOWEN_KEYS.items()]
    compared: set[str] = set()  # every selector's settings too (two may read one key)
    for cls in (ValuationSettings, SelectionParams, Guards, *registry.settings_types()):
        keyed = [f for f in dataclasses.fields(cls) if f.name in SETTINGS_KEYS]
        pairs += [(f"{cls.__name__}.{f.name}", field_default(f), app[SETTINGS_KEYS[f.name]])
                  for f in keyed]
        compared.update(f.name for f in keyed)
    # the recipe's keys default to "the model's recipe": the default run's (LeNet) is the base
    trains = RunConfig(**{f.name: app[f.name.replace("_", "-")]
                          for f in dataclasses.fields(TrainConfig)}).train_config()
    pairs += [(f"TrainConfig.{f.name}", f.default, getattr(trains, f.name))
              for f in dataclasses.fields(TrainConfig)]
    metric = inspect.signature(CoalitionUtility).parameters["metric"].default
    pairs.append(("CoalitionUtility(metric)", metric, app["utility-metric"]))
    # Assert: equal, key by key (valuation-params is text in the run config)
    differ = [(name, lib, key) for name, lib, key in pairs
              if lib != (parse_params(key, "") if name.endswith(".params") else key)]
    assert differ == []
    assert compared == set(SETTINGS_KEYS)
    settings_pairs = sum(name.partition(".")[2] in SETTINGS_KEYS for name, _, _ in pairs)
    assert len(pairs) - settings_pairs == len(FEDOWEN_KEYS) + 5 + 1


def two_rounds(strategy: FedOwen, rounds: list[dict[str, Any]], model: torch.nn.Module
               ) -> None:
    strategy.on_round = lambda r, record, rows: rounds.append(record)
    grid = InProcessGrid(make_client(load_example()),
                         [{"partition-id": i} for i in range(NODES)])
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2)


def test_the_readme_example_runs_the_apps_game_value_for_value() -> None:
    # Prepare: the example's model and server data; the library as the example uses it (no
    # settings) and the app's strategy from its default run config, of the two rounds run
    example = load_example()
    torch.manual_seed(0)
    model = example.make_model()
    x, y = example.server_data()
    cfg = RunConfig(clients_per_round=K, seed=SEED, num_server_rounds=2)
    library = FedOwen(clients_per_round=K, seed=SEED,
                      utility_factory=CoalitionUtility(model, x, y))
    app = build_strategy(cfg, CoalitionUtility(model, x, y, metric=cfg.utility_metric), None)
    # Assert: the same settings, one by one
    assert library.valuation == app.valuation
    assert library.selection_params == app.selection_params
    # the same, once the library's start resolves the run's length (hics-rounds = 0)
    assert library.chooser.settings.for_run(2) == app.chooser.settings
    assert library.guards == app.guards
    assert (library.selection, library.norm_cap) == (app.selection, app.norm_cap)
    assert (library.node_wait_timeout, library.query_timeout) == (
        app.node_wait_timeout, app.query_timeout)
    # Execute: two rounds each, from the same initial model
    seen: dict[str, list[dict[str, Any]]] = {"library": [], "app": []}
    two_rounds(library, seen["library"], model)
    two_rounds(app, seen["app"], model)
    assert library.chooser.settings == app.chooser.settings
    # Assert: the same clients selected, the same values and weights (wall-clock aside: the
    # valuation's and, in the selection's record, the selector's seconds)
    lib, ours = ([without_seconds(r) for r in seen[name]] for name in ("library", "app"))
    assert len(lib) == 2 and "phi" in lib[0] and "norm_cap" in lib[0]
    assert lib == ours
