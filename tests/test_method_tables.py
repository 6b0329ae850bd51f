"""One table of methods and one of strategies (issue 30): validation, ``--help`` and the docs
name the same ones, and pyproject.toml's comments restate neither list.

The lists live in :data:`fedowen_strategy.round.round_valuers.METHODS` (from its ``ROUND_VALUERS``
table) and :data:`server_app.strategies.NAMES`; everything else reads them, and the docs that
describe each name are checked against them here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedowen_deploy.cli import parse_args
from fedowen_strategy.round.round_valuers import METHODS
from server_app.config import parse_run_config
from server_app.strategies import FLOWER, NAMES

ROOT = Path(__file__).resolve().parents[1]


def section(path: Path, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    text = path.read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    stop = re.search(rf"\n#{{1,{len(level)}}} ", text[start + 1:])
    return text[start: start + 1 + stop.start()] if stop else text[start:]


def listed_in_error(key: str, value: str) -> list[str]:
    """The choices the run-config validation lists for a misspelt ``key``."""
    with pytest.raises(ValueError) as err:
        parse_run_config({key: value})
    line = next(m for m in str(err.value).splitlines() if f"{key}={value!r}" in m)
    return line.split(" is not one of ", 1)[1].split(" (did you mean", 1)[0].split(", ")


def run_help(capsys: pytest.CaptureFixture[str]) -> str:
    """``python -m fedowen_deploy.cli --help``'s text without whitespace (argparse wraps,
    never reorders)."""
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    return re.sub(r"\s+", "", capsys.readouterr().out)


def test_validation_help_and_docs_name_the_same_valuation_methods(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Execute: the validation's message, the CLI's --help, the report's table
    in_error = listed_in_error("valuation", "owen-antithetc")
    help_text = run_help(capsys)
    table = section(ROOT / "docs" / "report.md", "## Valuation methods").split("---|---\n", 1)[1]
    rows = table.split("\n\n", 1)[0].splitlines()
    documented = [name for row in rows for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    # Assert
    assert in_error == list(METHODS)
    assert ",".join(METHODS) in help_text  # argparse may wrap, never reorder
    assert sorted(documented) == sorted(METHODS)


def test_validation_help_and_docs_name_the_same_strategies(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Execute
    in_error = listed_in_error("strategy", "fedavgg")
    help_text = run_help(capsys)
    readme = section(ROOT / "docs" / "guide.md", "## Swapping the strategy")
    flower_sentence = readme.split("or `module:Class`", 1)[0]
    # Assert: the README's list of Flower's classes is the table's, in its order, and every
    # strategy name is described there
    assert in_error[: len(NAMES)] == list(NAMES)
    assert ",".join(NAMES) in help_text
    assert re.findall(r"`(\w+)`", flower_sentence.split("Flower's own classes:", 1)[1]) == list(
        FLOWER)
    assert all(f"`{name}`" in readme or f'"{name}"' in readme for name in NAMES)


def test_pyproject_restates_neither_list() -> None:
    # Prepare: pyproject's comment blocks (runs of consecutive comment lines)
    blocks, block = [], ""
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.lstrip().startswith("#"):
            block += line + "\n"
        elif block:
            blocks, block = [*blocks, block], ""
    # Assert: no block names three or more methods or strategies (a list); a peer named
    # where its own keys are explained is not one
    for block in blocks:
        named = {name for name in (*METHODS, *NAMES) if name not in ("none", "fedowen")
                 and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", block)}
        assert len(named) < 3, (named, block)
