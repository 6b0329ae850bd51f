"""Run config: parsed once, every problem reported at once, every pyproject key known."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

from fedowen_task.config import ConfigError, TaskConfig, parse_task_config
from server_app.config import RunConfig, parse_run_config

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def pyproject_defaults() -> dict[str, object]:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]


def problems_of(run_config: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_run_config(run_config)
    return err.value.problems


def test_pyproject_defaults_parse_to_dataclass_defaults() -> None:
    # The embedded defaults and the dataclass must not drift apart (parsing fills the
    # recipe's "not set" keys with the model's recipe: LeNet's for the default MNIST)
    assert parse_run_config(pyproject_defaults()) == RunConfig().with_recipe()
    assert (RunConfig().lr, RunConfig().with_recipe().lr) == (0.0, 0.05)


def test_overrides_are_typed() -> None:
    cfg = parse_run_config({"alpha": 1, "valuation": "mc-shapley", "num-server-rounds": 5})
    assert cfg.alpha == 1.0 and isinstance(cfg.alpha, float)
    assert cfg.valuation == "mc-shapley" and cfg.num_server_rounds == 5


def test_every_problem_is_reported_at_once_with_suggestions() -> None:
    # A type error must not hide the unknown key or the out-of-range value
    problems = problems_of({"valuaton": "owen", "num-server-rounds": "ten", "seed": 1.5,
                            "imbalance-factor": 1.5, "zzz": 1})
    assert "unknown key 'valuaton' (did you mean 'valuation'?)" in problems
    assert "num-server-rounds='ten' should be int" in problems
    assert "seed=1.5 should be int" in problems
    assert ("imbalance-factor=1.5 must lie in [0, 1] (0 = the data's own class counts, no "
            "long-tailed transform)") in problems
    assert "unknown key 'zzz'" in problems  # no close match: the valid keys are listed
    assert any(p.startswith("valid keys: ") and "alpha" in p for p in problems)
    assert len(problems) == 6


@pytest.mark.parametrize(("key", "value", "message"), [
    ("valuation", "owne", "valuation='owne' is not one of"),
    ("valuation", "owne", "(did you mean 'owen'?)"),
    ("epsilon", 2.0, "epsilon=2.0"),
    ("data-dir", "relative/path", "data-dir='relative/path' must be an absolute path"),
    ("valuation-params", "eta", "valuation-params item 'eta' is not key=value"),
    ("dataset", "mnsit", "(did you mean 'mnist'?)"),
    ("strategy", "fedprx", "(did you mean 'fedprox'?)"),
    ("update-bound", "median", "update-bound='median' is not one of"),
    ("update-bound-multiple", 1.0, "update-bound-multiple=1.0 must be > 1"),
    ("max-norm-ratio", -1.0, "max-norm-ratio=-1.0 must be >= 0"),
    ("fltrust-root-epochs", 0, "fltrust-root-epochs=0 must be >= 1"),
    ("fltrust-root-size", -1, "fltrust-root-size=-1 must be >= 0"),
    ("fltrust-server-lr", 0.0, "fltrust-server-lr=0.0 must be a finite number > 0"),
    ("foolsgold-kappa", 0.0, "foolsgold-kappa=0.0 must be > 0"),
    ("value-cap-multiple", -1.0, "value-cap-multiple=-1.0 must be >= 0"),
    ("value-cap-mode", "exact", "value-cap-mode='exact'"),
    ("adversary-kind", "colluding-sybl", "(did you mean 'colluding-sybil'?)"),
    ("adversary-boost", 0.0, "adversary-boost=0.0 must be > 0"),
    ("adversary-sybil-noise", -0.1, "adversary-sybil-noise=-0.1 must be >= 0"),
    ("strategy", "foolgold", "(did you mean 'foolsgold'?)"),
])
def test_out_of_range_values_fail_loudly(key: str, value: object, message: str) -> None:
    assert any(message in p for p in problems_of({key: value})), problems_of({key: value})


#: One bad value per run-config key (a wrong type where no value of the right type is wrong).
ONE_MISTAKE = {
    "num-server-rounds": 0, "clients-per-round": 0, "fraction-evaluate": 2.0,
    "dataset": "mnsit", "model": "lenet5", "data-dir": "data", "download": "yes",
    "output-dir": "out", "alpha": 0.0, "imbalance-factor": 2.0, "partition-scheme": "classes",
    "min-partition-size": -1, "eval-fraction": 0.0, "validation-fraction": 0.995, "seed": "one",
    "lr": -0.1, "momentum": 1.0, "batch-size": -1, "local-epochs": -2, "weight-decay": -0.5,
    "client-max-samples": -1, "test-max-samples": -1, "eval-every": 0, "strategy": "fedprx",
    "strategy-params": "eta=0.1", "proximal-mu": -1.0, "valuation": "owne",
    "valuation-params": "eta", "selection": "bandit", "aggregation": "mean", "budget-m": 0,
    "owen-q": 0, "utility-metric": "loss", "game": "sum", "phi-scale": "l2",
    "temperature": 0.0, "uniform-mix": 2.0, "weight-cap": 0.0, "epsilon": 2.0, "ucb-c": -1.0,
    "tau": math.nan, "bandit-memory": "last", "bandit-discount": 0.0, "poc-d": 0,
    "oort-exploration-min": 2.0, "selection-reward": "value", "selection-level": 0.0,
    "greedyfed-memory": "latest",
    "delta-estimator": "biased", "delta-floor": 2.0, "delta-sigma-weight": -1.0,
    "delta-score": "papers", "delta-draw": "with",
    "hics-temperature": 0.0, "hics-lambda": -1.0, "hics-gamma": -1.0, "hics-clusters": -1,
    "hics-rounds": -1, "hics-switch": -0.1, "delta-phi-floor": 2.0,
    "selection-cap": 0.5, "exclusion-level": 1.0, "exclusion-min-rounds": 1,
    "max-norm-ratio": -1.0, "update-bound": "median",
    "update-bound-multiple": 1.0, "norm-cap": "mean", "norm-cap-multiple": 0.0,
    "value-cap-multiple": -1.0, "value-cap-mode": "exact", "link-memory": -1,
    "link-cosine": 1.0, "round-timeout": 0.0, "verbose": "yes", "node-wait-timeout": 0.0,
    "max-stalled-rounds": -1,
    "duplicate-tolerance": 1.0, "resume-from": "run", "adversary-fraction": 2.0,
    "adversary-kind": "flip", "adversary-noise-std": -1.0, "adversary-sybil-noise": -1.0,
    "adversary-boost": 0.0, "adversary-alie-z": -1.0, "adversary-ipm-epsilon": 0.0,
    "adversary-jitter": -1.0, "adversary-trigger": "star", "adversary-trigger-size": 0,
    "adversary-trigger-position": "middle", "adversary-target": -1,
    "adversary-poison-fraction": 0.0, "update-filter": "flame", "robust-lr-threshold": -1,
    "aggregate-noise": -0.001, "statistics-cap": -1.0, "krum-malicious": -1,
    "statistics-rule": "mode", "defences": "norm-capp", "adversary-statistics-scale": 0.0,
    "alignins-sparsity": 0.0, "alignins-lambda-s": 0.0, "alignins-lambda-c": -1.0,
    "multi-metrics-keep": 1.5, "flame-lambda": -0.001, "indicator-threshold": 0.0,
    "indicator-epochs": 0,
    "indicator-lr": 0.0, "indicator-mu": -0.1, "indicator-ood": "mnist",
    "indicator-samples": 63,
    "adversary-dba-parts": 0, "adversary-dba-gap": -1, "adversary-neurotoxin-top": 1.0,
    "adversary-knows": "everything",
    "fltrust-root-size": -1,
    "fltrust-root-epochs": 0, "fltrust-server-lr": 0.0, "foolsgold-kappa": 0.0, "device": 1,
    "torch-threads": -1, "valuation-workers": -1,
}


def test_one_mistake_is_one_problem_naming_its_key() -> None:
    # Prepare: every key of pyproject.toml has a bad value here
    assert set(ONE_MISTAKE) == set(pyproject_defaults())
    for key, value in ONE_MISTAKE.items():
        # Execute
        problems = problems_of({key: value})
        # Assert: one problem, and it names the key (not a library field's name)
        assert len(problems) == 1, (key, problems)
        assert re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", problems[0]), (key, problems)


def test_cross_key_rules_use_the_estimator_registry() -> None:
    # owen needs n + 1 evaluations for n updates: budget-m = 1 gives only n
    (budget,) = problems_of({"valuation": "owen", "budget-m": 1})
    assert "budget=1 is too small for 'owen'" in budget and "raise budget-m" in budget
    (param,) = problems_of({"valuation": "owen", "valuation-params": "etta=0.1"})
    assert "unknown parameter(s) ['etta'] for 'owen'" in param and "eta=" in param
    (typed,) = problems_of({"valuation": "owen", "valuation-params": "antithetic=3.5"})
    assert "antithetic=3.5 should be bool" in typed
    (exact,) = problems_of({"valuation": "exact", "clients-per-round": 21})
    assert "refuses n_players=21" in exact
    (none,) = problems_of({"valuation": "none", "valuation-params": "eta=0.1"})
    assert "takes no parameters" in none


def test_the_value_cap_is_on_by_default_and_follows_the_norm_cap() -> None:
    guards = parse_run_config({}).guards()
    assert (guards.value_cap_multiple, guards.value_cap_mode) == (1.0, "exactly")
    # norm-cap none leaves no reference to value at: a valid config, valued as averaged
    # (tests/test_round_step.py shows the round)
    cfg = parse_run_config({"norm-cap": "none"})
    assert (cfg.choices().norm_cap, cfg.guards().value_cap_multiple) == ("none", 1.0)


def test_valuing_exactly_at_the_cap_needs_a_value_cap() -> None:
    (mode,) = problems_of({"value-cap-multiple": 0.0, "value-cap-mode": "exactly"})
    assert "set value-cap-multiple > 0" in mode
    guards = parse_run_config({"value-cap-multiple": 0.0, "value-cap-mode": "at-most"}).guards()
    assert (guards.value_cap_multiple, guards.value_cap_mode) == (0.0, "at-most")


def test_first_order_needs_the_delta_game_with_neg_loss() -> None:
    assert parse_run_config({"valuation": "first-order", "budget-m": 2})
    assert parse_run_config({"valuation": "owen-antithetic", "budget-m": 2})
    (game,) = problems_of({"valuation": "first-order", "game": "average"})
    assert "first-order terms of the delta game" in game and "game='average'" in game
    (metric,) = problems_of({"valuation": "first-order", "utility-metric": "accuracy"})
    assert "utility-metric='accuracy'" in metric


def test_strategy_keys_are_checked_against_the_flower_class() -> None:
    assert parse_run_config({"strategy": "fedadam", "strategy-params": "eta=0.01"})
    (unknown,) = problems_of({"strategy": "fedadam", "strategy-params": "etaa=0.01"})
    assert "FedAdam has no parameter 'etaa' (did you mean 'eta'?)" in unknown
    (mu,) = problems_of({"strategy": "fedavg", "proximal-mu": 0.1})
    assert "proximal-mu=0.1 is FedProx's" in mu
    (resume,) = problems_of({"strategy": "fedyogi", "resume-from": "/tmp/run"})
    assert "resume-from" in resume
    # the peers are registered like Flower's classes; their own keys are not strategy-params
    assert parse_run_config({"strategy": "fltrust", "resume-from": "/tmp/run"})
    (kappa,) = problems_of({"strategy": "foolsgold", "strategy-params": "kappa=2"})
    assert "kappa is set by the run config" in kappa
    (gold,) = problems_of({"strategy": "foolsgold", "resume-from": "/tmp/run"})
    assert "resume-from" in gold
    assert problems_of({"strategy": "no.such.module:Strategy"})[0].startswith(
        "strategy='no.such.module:Strategy': cannot import")


def test_estimator_params_and_model_choice() -> None:
    cfg = parse_run_config({"valuation": "owen-paper", "owen-q": 4,
                            "valuation-params": "eta=0.05"})
    assert cfg.estimator_params() == {"levels": 4, "eta": 0.05}
    cfg = parse_run_config({"valuation": "owen", "valuation-params": "antithetic=true"})
    assert cfg.estimator_params() == {"antithetic": True}
    assert parse_run_config({"valuation-params": "strata=2"}).estimator_params() == {"strata": 2}
    assert parse_run_config({"dataset": "cifar10"}).model_name() == "resnet18"
    assert parse_run_config({"dataset": "femnist"}).model_name() == "lenet"


def test_client_reads_only_its_keys() -> None:
    # Server keys and a user's own keys are ignored; the task keys are still validated
    cfg = parse_task_config({"alpha": 0.5, "valuation": "whatever", "my-own-key": 1})
    assert cfg == TaskConfig(alpha=0.5).with_recipe()
    with pytest.raises(ConfigError, match=r"lr=-0\.1 must be > 0 \(or 0\.0: the model's recipe\)"):
        parse_task_config({"lr": -0.1, "valuation": "whatever"})
