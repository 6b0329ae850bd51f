"""A recipe per model (issue 70): each model's own, the run-config keys over it field by
field, a user's factory's declared recipe, and the recipe a run records."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

import pytest

from fedowen_task.config import ConfigError, TaskConfig, parse_task_config
from fedowen_task.models import model_recipe
from fedowen_task.recipe import FROM_MODEL, RecipeKeys, TrainConfig, keys_problems
from server_app.config import parse_run_config
from server_app.finish import run_summary


def test_keys_left_unset_take_the_models_recipe() -> None:
    # Execute: CIFAR-10's auto model, LeNet by default, and the GroupNorm ResNet-18
    cifar = parse_run_config({"dataset": "cifar10"})
    mnist = parse_run_config({})
    gn = parse_run_config({"dataset": "cifar10", "model": "resnet18-gn"})
    # Assert: the keys hold the recipe the run trains with (config.json records them)
    assert (cifar.model_name(), cifar.lr, cifar.momentum, cifar.batch_size) == (
        "resnet18", 0.01, 0.5, 10)
    assert cifar.train_config() == model_recipe("resnet18") == TrainConfig(lr=0.01)
    assert mnist.train_config() == TrainConfig() and mnist.lr == 0.05
    assert (gn.lr, gn.weight_decay, gn.local_epochs) == (0.003, 0.0, 1)


def test_a_key_that_is_set_overrides_its_field_alone() -> None:
    # Execute: momentum and weight decay set on ResNet-18, whose lr stays its recipe's
    cfg = parse_run_config({"dataset": "cifar10", "momentum": 0.0, "weight-decay": 5e-4})
    # Assert: 0 is a momentum and a weight decay (their "not set" is -1)
    assert cfg.train_config() == TrainConfig(lr=0.01, momentum=0.0, weight_decay=5e-4)
    assert parse_run_config({"model": "resnet18", "lr": 0.05}).train_config().lr == 0.05


def test_resolving_twice_changes_nothing_and_the_client_resolves_as_the_server() -> None:
    # Prepare
    run_config = {"dataset": "cifar10", "model": "resnet18-gn", "batch-size": 20}
    # Execute
    server = parse_run_config(run_config)
    client = parse_task_config(run_config)
    # Assert
    assert server.with_recipe() == server
    assert server.train_config() == client.train_config() == TrainConfig(lr=0.003,
                                                                           batch_size=20)
    assert TaskConfig().lr == FROM_MODEL["lr"] == 0.0


def test_a_factorys_declared_recipe_is_its_default() -> None:
    # Execute
    mapping = parse_run_config({"model": "tests.user_recipes:with_mapping"})
    whole = parse_run_config({"model": "tests.user_recipes:with_train_config", "lr": 0.3})
    plain = parse_run_config({"model": "tests.user_models:tiny_bn"})
    # Assert: a mapping's fields over the base recipe; a TrainConfig as declared, lr set
    assert mapping.train_config() == TrainConfig(lr=0.02, batch_size=20)
    assert whole.train_config() == TrainConfig(lr=0.3, momentum=0.9, batch_size=32,
                                               local_epochs=2, weight_decay=5e-4)
    assert plain.train_config() == TrainConfig()


@pytest.mark.parametrize(("factory", "message"), [
    ("bad_value", r"model='tests.user_recipes:bad_value': its recipe \{'momentum': 1.5\} is "
                  r"invalid: .*momentum=1.5 must lie in \[0, 1\)"),
    ("unknown_field", "model='tests.user_recipes:unknown_field': its recipe names "
                      "learning_rate, not fields of the recipe"),
])
def test_a_bad_declared_recipe_is_one_problem_naming_the_model(factory: str,
                                                               message: str) -> None:
    # Execute
    with pytest.raises(ConfigError) as err:
        parse_run_config({"model": f"tests.user_recipes:{factory}"})
    # Assert
    (problem,) = err.value.problems
    assert re.search(message, problem), problem


def test_bad_keys_name_the_key_and_what_not_set_is() -> None:
    # Execute
    found = keys_problems(RecipeKeys(lr=-0.1, momentum=-0.5, batch_size=-1, local_epochs=0,
                                     weight_decay=-1.0), {"batch_size": "batch-size"})
    # Assert: the two "not set" values are no problem
    assert found == ["lr=-0.1 must be > 0 (or 0.0: the model's recipe)",
                     "momentum=-0.5 must lie in [0, 1) (or -1.0: the model's recipe)",
                     "batch-size=-1 must be an int >= 1 (or 0: the model's recipe)"]


def test_the_summary_records_the_model_and_its_recipe(tmp_path: Path) -> None:
    # Prepare
    cfg = parse_run_config({"dataset": "cifar10", "num-server-rounds": 1})
    # Execute
    summary = run_summary(cfg, tmp_path, 0, 0.0)
    # Assert
    assert summary["model"] == "resnet18"
    assert summary["recipe"] == asdict(TrainConfig(lr=0.01)) == {
        "lr": 0.01, "momentum": 0.5, "batch_size": 10, "local_epochs": 1, "weight_decay": 0.0}
