"""Run config: parsed once, validated, every pyproject key known."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from server_app.config import RunConfig, parse_run_config

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def pyproject_defaults() -> dict[str, object]:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]


def test_pyproject_defaults_parse_to_dataclass_defaults() -> None:
    # The embedded defaults and the dataclass must not drift apart
    assert parse_run_config(pyproject_defaults()) == RunConfig()


def test_overrides_are_typed() -> None:
    cfg = parse_run_config({"alpha": 1, "valuation": "mc-shapley", "num-server-rounds": 5})
    assert cfg.alpha == 1.0 and isinstance(cfg.alpha, float)
    assert cfg.valuation == "mc-shapley" and cfg.num_server_rounds == 5


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ValueError) as err:
        parse_run_config({"alpah": 0.1, "num-server-rounds": "ten", "seed": 1.5})
    text = str(err.value)
    assert "unknown key 'alpah'" in text
    assert "num-server-rounds='ten' should be int" in text
    assert "seed=1.5 should be int" in text
    assert "Valid keys:" in text and "alpha" in text


@pytest.mark.parametrize(("key", "value", "message"), [
    ("valuation", "shapley", "valuation must be one of"),
    ("imbalance-factor", 0.0, "imbalance-factor must lie in (0, 1]"),
    ("epsilon", 2.0, "epsilon=2.0"),
    ("data-dir", "relative/path", "data-dir must be absolute"),
    ("valuation-params", "eta", "not key=value"),
    ("update-bound", "median", "update-bound must be one of"),
    ("update-bound-multiple", 1.0, "update-bound-multiple must be > 1"),
    ("max-norm-ratio", -1.0, "max-norm-ratio must be >= 0"),
])
def test_out_of_range_values_fail_loudly(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        parse_run_config({key: value})


def test_estimator_params_and_model_choice() -> None:
    cfg = parse_run_config({"valuation": "owen-paper", "owen-q": 4,
                            "valuation-params": "eta=0.05 antithetic=false"})
    assert cfg.estimator_params() == {"levels": 4, "eta": 0.05, "antithetic": False}
    assert parse_run_config({"valuation-params": "strata=2"}).estimator_params() == {"strata": 2}
    assert parse_run_config({"dataset": "cifar10"}).model_name() == "resnet18"
    assert parse_run_config({"dataset": "femnist"}).model_name() == "lenet"
