"""Every run-config key is declared once (fedowen_task.declare), and a key added by one
declaration reaches the parser, the problems list, the CLI, the pyproject check and the docs."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from fedowen_deploy.cli import parse_args
from fedowen_strategy.round.contribution import ValuationSettings
from fedowen_task.config import ConfigError, parse_config
from fedowen_task.declare import at_least, declarations, declared, key, owned
from server_app.config import RunConfig
from server_app.keys import DOCS, defaults_hash, docs_table, learning_defaults, pyproject_problems

ROOT = Path(__file__).resolve().parents[1]


def pyproject_table() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


@dataclass(frozen=True)
class WithThrowaway(RunConfig):
    throwaway_knob: int = key(7, "a throwaway knob", rule=at_least(1))


def test_a_key_added_by_one_declaration_reaches_everything(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Execute / Assert: the parser reads it, its rule is a problem
    assert parse_config(WithThrowaway, {"throwaway-knob": 3}).throwaway_knob == 3
    with pytest.raises(ConfigError) as err:
        parse_config(WithThrowaway, {"throwaway-knob": 0})
    assert err.value.problems == ["throwaway-knob=0 must be >= 1"]
    # the CLI's flag, its help and its default
    assert parse_args(["--throwaway-knob", "5"], WithThrowaway).throwaway_knob == 5
    assert parse_args([], WithThrowaway).throwaway_knob is None  # not sent: the default applies
    with pytest.raises(SystemExit):
        parse_args(["--help"], WithThrowaway)
    assert "a throwaway knob (default: 7)" in " ".join(capsys.readouterr().out.split())
    # the pyproject check asks for it, and is content once it is there
    table = pyproject_table()
    assert pyproject_problems(table, WithThrowaway) == [
        "throwaway-knob is declared but not in pyproject.toml (default 7)"]
    assert pyproject_problems({**table, "throwaway-knob": 7}, WithThrowaway) == []
    assert pyproject_problems({**table, "throwaway-knob": 8}, WithThrowaway) == [
        "throwaway-knob = 8 in pyproject.toml, 7 declared"]
    # the docs table has its row
    assert "| `throwaway-knob` | `7` | int | a throwaway knob |" in docs_table(WithThrowaway)


def test_every_key_is_declared_once() -> None:
    twice = {k: sites for k, sites in declarations(RunConfig).items() if len(sites) != 1}
    assert twice == {}
    assert {f.name for f in fields(RunConfig)} == {k.field for k in declared(RunConfig)}


def test_a_key_declared_twice_is_found() -> None:
    @dataclass(frozen=True)
    class Again(RunConfig):
        alpha: float = key(0.5, "alpha again")
        temperature: float = key(2.0, "a second temperature")

    sites = declarations(Again)
    assert sites["alpha"] == ["_DataKeys.alpha", "Again.alpha"]
    assert sorted(sites["temperature"]) == ["Again.temperature", "ValuationSettings.temperature"]


def test_a_settings_key_takes_the_librarys_declaration() -> None:
    @dataclass(frozen=True)
    class Placed:
        budget_m: int = owned(ValuationSettings, "budget_m")

    (placed,) = declared(Placed)
    assert (placed.name, placed.default, placed.owner) == ("budget-m", 4, ValuationSettings)
    assert placed.help == declared(ValuationSettings)[1].help


def test_pyproject_and_the_docs_table_follow_the_declarations() -> None:
    assert pyproject_problems(pyproject_table()) == []
    assert DOCS.read_text() == docs_table(), "run: python -m server_app.keys"


def test_the_defaults_hash_moves_with_a_learning_default_only() -> None:
    @dataclass(frozen=True)
    class Shifted(RunConfig):
        alpha: float = key(0.5, "alpha, moved")

    @dataclass(frozen=True)
    class Slower(RunConfig):
        round_timeout: float = key(60.0, "a shorter timeout")

    assert "round-timeout" not in learning_defaults()
    assert defaults_hash(Slower) == defaults_hash() != defaults_hash(Shifted)
