"""The selector protocol (issue 62): the strategy and the shared selection code name no
selector; a new selector is one module and one table row (the guide's example, run from
docs/selection.md); a selector's weights reach the aggregation; checkpoints of the new
format resume, of another selector are refused by name."""

from __future__ import annotations

import ast
import json
import re
import sys
import time
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import numpy as np
import pytest

from fedowen_strategy.round.contribution import resolve_auto
from fedowen_strategy.selectors import registry
from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    Pool,
    Seen,
    Selector,
    SelectorSettings,
)
from fedowen_strategy.selectors.registry import SELECTORS, SelectorSpec
from fedowen_strategy.selectors.shared import Selection, SelectionParams, select_uniform
from server_app.store.records import read_rounds
from tests.test_strategy import run_toy

ROOT = Path(__file__).resolve().parents[1]
#: The strategy and the selection code every selector shares.
SHARED = [ROOT / "fedowen_strategy" / "strategy.py",
          *(ROOT / "fedowen_strategy" / "selectors" / name
            for name in ("__init__.py", "base.py", "shared.py"))]


def selector_names_in(source: str) -> list[str]:
    """Where ``source`` names a registered selector: a string (not a docstring) holding one of
    their names as a word, or an identifier of a selector module or class."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    words = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, SELECTORS)) + r")(?![\w-])")
    modules = {spec.make.__module__ for spec in SELECTORS.values()}
    classes = ({spec.make.__name__ for spec in SELECTORS.values()}
               | {spec.settings.__name__ for spec in SELECTORS.values()})
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings and words.search(node.value)):
            found.append(f"line {node.lineno}: {node.value!r}")
        names = ([node.id] if isinstance(node, ast.Name) else [node.attr]
                 if isinstance(node, ast.Attribute) else
                 [a.name for a in node.names] if isinstance(node, ast.ImportFrom | ast.Import)
                 else [])
        found += [f"line {node.lineno}: {n}" for n in names if n in classes]
        imported = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found += [f"line {node.lineno}: {m}" for m in imported if m in modules]
    return found


def test_the_strategy_and_the_shared_selection_code_name_no_selector() -> None:
    # Prepare: the check catches a branch on a name, a selector's class and its module
    assert selector_names_in('if self.selection == "oort":\n    pass\n')
    assert selector_names_in("x = f'selection={name!r} not power-of-choice'\n")
    assert selector_names_in("from fedowen_strategy.selectors.oort import Oort\n")
    assert selector_names_in("state = Adaptive(settings)\n")
    assert not selector_names_in('"""the adaptive selector, random draws"""\nx = "randomly"\n')
    # Execute / Assert
    for path in SHARED:
        assert selector_names_in(path.read_text()) == [], path


def load_guide_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                       ) -> tuple[ModuleType, SelectorSpec]:
    """The guide's example module and its row, from docs/selection.md ("Adding a selector"),
    registered as one more row of ``SELECTORS``."""
    guide = (ROOT / "docs" / "selection.md").read_text().split("## Adding a selector", 1)[1]
    module_code, row_code = re.findall(r"```python\n(.*?)```", guide, re.S)[:2]
    (tmp_path / "round_robin_example.py").write_text(module_code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "round_robin_example", raising=False)
    import round_robin_example as example

    spec = eval(row_code.strip().rstrip(","), {**vars(example), "SelectorSpec": SelectorSpec})
    monkeypatch.setattr(registry, "SELECTORS", MappingProxyType({**SELECTORS,
                                                                 spec.name: spec}))
    return example, spec


def test_the_guides_example_selector_is_one_module_and_one_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    example, spec = load_guide_example(tmp_path, monkeypatch)
    # Execute: four rounds of 2 of the toy's 6 clients, by name and by settings
    strategy = run_toy("owen", rounds=4, k=2, tmp_path=tmp_path / "run",
                       selection="round-robin")
    mixed = run_toy("owen", rounds=2, k=2, selection=example.RoundRobinSettings(
        rr_random_share=0.5))
    # Assert: round robin by id (every client returns), its record and its memory
    rounds = read_rounds(tmp_path / "run")[1:]
    assert [r["selected"] for r in rounds] == [["c0", "c1"], ["c2", "c3"], ["c4", "c5"],
                                               ["c0", "c1"]]
    seconds = rounds[0]["selection"].pop("selector_seconds")
    assert rounds[0]["selection"] == {"drawn": 0, "how": "round-robin", "extra_messages": 0}
    assert seconds >= 0
    state = json.loads(json.dumps(strategy.state_dict()))["selection"]
    assert state["selector"] == "round-robin" and state["state"]["last"]["c5"] == 3
    assert mixed.chooser.choose([f"c{i}" for i in range(6)], 3, 2).record == {
        "drawn": 1, "how": "round-robin"}
    # its key's rule, and the table's checks see the row
    with pytest.raises(ValueError, match=r"rr_random_share=2\.0 must lie in \[0, 1\]"):
        example.RoundRobinSettings(rr_random_share=2.0)
    assert resolve_auto("none", "round-robin", "uniform").cap == spec.default_cap == 0.0


class FirstTakesAll(Selector):
    """A uniform pick whose aggregation gives every weight to the first accepted update (the
    shape of DELTA's importance weights: the selector, not the valuation, weighs)."""

    def __init__(self, settings: SelectorSettings) -> None:
        self.settings = settings

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        return Choice(select_uniform(len(pool.keys), pool.k, rng), "first")

    def weigh(self, clients: Any, weights: np.ndarray) -> np.ndarray:
        return np.eye(len(clients))[0]


class FirstSettings(SelectorSettings):
    selector = "first-takes-all"


def test_a_selectors_weights_are_the_rounds_aggregation(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    # Prepare: one more row
    monkeypatch.setattr(registry, "SELECTORS", MappingProxyType({
        **SELECTORS, "first-takes-all": SelectorSpec("first-takes-all", FirstTakesAll,
                                                     FirstSettings)}))
    # Execute
    run_toy("owen", rounds=1, k=4, tmp_path=tmp_path, selection="first-takes-all")
    # Assert: the record's weights are the selector's (all on the first accepted client)
    record = read_rounds(tmp_path)[1]
    weights = record["weights"]
    first = record["returned"][0]
    assert weights[first] == 1.0 and sum(weights.values()) == 1.0
    # it records nothing of its choice: the record holds what every selector's does
    assert set(record["selection"]) == {"how", "extra_messages", "selector_seconds"}


@pytest.mark.parametrize("selection", ["adaptive", "posterior"])
def test_a_new_checkpoint_resumes_and_one_of_another_selector_is_refused(selection: str
                                                                        ) -> None:
    # Prepare: three rounds, then the state as a checkpoint keeps it
    first = run_toy("owen", rounds=3, k=3, selection=selection)
    state = json.loads(json.dumps(first.state_dict()))
    # Execute: a fresh strategy loads it
    again = run_toy("owen", rounds=0, k=3, selection=selection)
    again.load_state_dict(state)
    # Assert: the same memory, the same next pick; another selector's run refuses it by name
    assert again.chooser.state() == first.chooser.state()
    keys = [f"c{i}" for i in range(6)]
    np.testing.assert_array_equal(again.chooser.choose(keys, 4, 3).indices,
                                  first.chooser.choose(keys, 4, 3).indices)
    other = run_toy("owen", rounds=0, k=3, selection="screened")
    with pytest.raises(ValueError, match=f"selection='{selection}''s, this run selects with "
                                         "'screened': resume with"):
        other.load_state_dict(state)


class SlowToObserve(Selector):
    """Asks every client of the pool (whose answers are slow), then takes the first k; its
    observation and weighing take time of their own."""

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        ask(range(len(pool.keys)), {"probe": 1})
        return Choice(np.arange(pool.k), "first")

    def weigh(self, clients: Any, weights: Any) -> Any:
        time.sleep(0.05)
        return weights

    def observe(self, seen: Any) -> None:
        time.sleep(0.05)


def test_the_shared_selection_measures_every_selectors_cost_alike() -> None:
    # Prepare: answers that take 0.3 s, which is the clients' time, not the selector's
    def slow_answers(indices: Any, config: Any, with_model: bool = True) -> list[None]:
        time.sleep(0.3)
        return [None for _ in indices]

    chooser = Selection("slow", SlowToObserve(), FirstSettings(), SelectionParams(), 0.0,
                        np.random.default_rng(0))
    keys = [f"c{i}" for i in range(5)]
    # Execute: a round, then the next round's choice
    chooser.choose(keys, 1, 2, slow_answers)
    chooser.weigh(keys[:2], np.full(2, 0.5))
    chooser.observe(Seen(1, tuple(keys[:2]), None))
    first = chooser.costs()
    chooser.choose(keys[:3], 2, 2, slow_answers)
    # Assert: 5 messages, the selector's own 0.1 s without the 0.3 s waited on answers; the
    # next choice starts a new round's count
    assert first["extra_messages"] == 5
    assert 0.1 <= first["selector_seconds"] < 0.3
    assert chooser.costs()["extra_messages"] == 3 and chooser.costs()["selector_seconds"] < 0.3
