"""The defences as a list (issue 72): one protocol, one table, the old keys' meaning kept, and
the same list around Flower's own strategies (:class:`fedowen_strategy.defences.defended.
Defended`) as inside FedOwen."""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedowen_strategy.defences import table
from fedowen_strategy.defences.base import Guard
from fedowen_strategy.defences.defended import Defended
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.guards import guard_round
from fedowen_strategy.replies import ClientUpdate, record_to_state, state_to_record
from server_app.config import parse_run_config
from sim.inline_grid import InProcessGrid

GLOBAL = {"w": np.ones(4, np.float32)}  # norm 2


def reply(delta: float, cid: str, node: int, examples: int = 10) -> Message:
    """Client ``cid`` on ``node`` returns ``GLOBAL + delta`` (every coordinate)."""
    request = Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=node)
    content = RecordDict({"arrays": state_to_record({"w": GLOBAL["w"] + np.float32(delta)}),
                          "metrics": MetricRecord({"num-examples": examples}),
                          "client": ConfigRecord({"client-id": cid})})
    return Message(content, reply_to=request)


def idle(msg: Message, ctx: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)


def configured(strategy: Defended, nodes: int = 4) -> Defended:
    """``strategy`` after its round-1 ``configure_train`` over ``nodes`` in-process nodes."""
    grid = InProcessGrid(idle, [{"partition-id": i} for i in range(nodes)])
    list(strategy.configure_train(1, state_to_record(GLOBAL), ConfigRecord(), grid))
    return strategy


def test_every_row_is_its_own_guard_and_the_auto_lists_are_rows() -> None:
    # Execute
    made = {name: spec.make() for name, spec in table.DEFENCES.items()}
    # Assert
    assert all(isinstance(g, Guard) and g.name == name for name, g in made.items())
    # FedOwen's list is every row but the peers' opt-in defences (issue 72, deliver 2)
    assert set(table.DEFENCES) - set(table.FEDOWEN_DEFENCES) == {"alignins", "multi-metrics",
                                                                  "flame", "indicator"}
    assert table.resolve("auto", fedowen=True) == table.FEDOWEN_DEFENCES
    assert table.resolve("auto", fedowen=False) == ("statistics-cap", "statistics-rule")
    assert table.resolve("none", fedowen=True) == ()
    assert table.resolve("norm-cap, links", fedowen=True) == ("norm-cap", "links")


def test_a_wrong_list_is_one_problem_per_mistake_naming_the_value() -> None:
    # Execute
    found = table.problems("norm-cap links norm-capp links")
    # Assert
    assert found == [
        "defences: 'norm-capp' is not a defence (did you mean 'norm-cap'?); the table has "
        f"{', '.join(table.DEFENCES)} (docs/defences.md)",
        "defences: 'links' is listed twice; each defence acts once a round"]
    assert table.problems("auto") == table.problems("none") == []
    assert "names no defence" in table.problems(" ")[0]
    with pytest.raises(ValueError, match="'norm-capp' is not a defence"):
        table.build("norm-capp", fedowen=True)


def test_auto_with_other_names_says_it_stands_alone_and_gives_the_list_meant() -> None:
    # Execute
    found = table.problems("auto alignins")
    # Assert: one problem, with FedOwen's list and alignins among its screens, copyable
    assert len(found) == 1 and "'auto' stands alone" in found[0]
    meant = found[0].split('defences = "')[1].split('"')[0]
    assert table.resolve(meant, fedowen=True) == (
        "identity", "norm-ratio", "update-bound", "update-filter", "alignins", "norm-cap",
        "statistics-cap", "value-cap", "links", "statistics-rule", "robust-lr",
        "aggregate-noise")
    # a misspelt name beside none is its own problem and stays out of the list meant
    both = table.problems("none flamee")
    assert len(both) == 2 and "'none' stands alone" in both[0] and "to add a defence" in both[0]
    assert "'flamee' is not a defence (did you mean 'flame'?)" in both[1]


def test_the_run_config_checks_the_key_and_hands_fedowen_its_list() -> None:
    # Execute
    cfg = parse_run_config({"defences": "norm-ratio links"})
    # Assert
    assert cfg.fedowen_arguments()["defences"] == "norm-ratio links"
    with pytest.raises(ValueError, match="'link' is not a defence"):
        parse_run_config({"defences": "norm-ratio link"})


def test_the_old_keys_still_switch_their_steps_inside_the_default_list() -> None:
    # Prepare: c2 is 100x the others; max-norm-ratio 10 (the default) x the global norm 2
    updates = [ClientUpdate(i, f"c{i}", {"w": GLOBAL["w"] + d}, 10, 0.0)
               for i, d in enumerate(np.float32([0.1, 0.2, 100.0, 1.0]))]
    # Execute
    default = guard_round(updates, GLOBAL, Guards(), norm_cap="median", value_players=True)
    off = guard_round(updates, GLOBAL, Guards(max_norm_ratio=0.0), norm_cap="median",
                      value_players=True)
    dropped = guard_round(updates, GLOBAL, Guards(), norm_cap="median", value_players=True,
                          defences=table.build("links", fedowen=True))
    # Assert: the default list rejects c2 (norm 200 > 20) and caps c3 at 2 x the lower median
    # of (0.2, 0.4, 2.0) = 0.8; the key at 0 lets c2 in (then capped, lower median 0.4 of 4);
    # a list without the steps leaves every update as sent
    assert list(default.rejected) == ["c2"] and default.record["norm_cap"] == pytest.approx(0.8)
    assert default.clipped == {} and list(default.record["capped"]) == ["c3"]
    assert off.rejected == {} and sorted(off.record["capped"]) == ["c2", "c3"]
    assert dropped.rejected == {} and "norm_cap" not in dropped.record
    assert [u.state["w"][0] for u in dropped.updates] == pytest.approx([1.1, 1.2, 101.0, 2.0])


def test_a_defence_list_around_flowers_fedavg_on_hand_built_replies() -> None:
    # Prepare: FedAvg (equal examples) wrapped with the norm ratio, a median norm cap and the
    # sign vote; replies: deltas 0.1, 0.2, 100 (rejected: norm 200 > 10 x 2) and 1.0 (norm 2,
    # capped to 2 x lower-median(0.2, 0.4, 2.0) = 0.8: delta 0.4)
    guards = Guards(norm_cap="median", robust_lr_threshold=0)
    wrapped = configured(Defended(FedAvg(fraction_train=1.0), ["norm-ratio", "norm-cap"],
                                  guards))
    replies = [reply(0.1, "c0", 1), reply(0.2, "c1", 2), reply(100.0, "c2", 3),
               reply(1.0, "c3", 4)]
    # Execute
    arrays, _ = wrapped.aggregate_train(1, replies)
    # Assert: FedAvg averaged the three it was passed: 1 + (0.1 + 0.2 + 0.4) / 3
    assert arrays is not None
    np.testing.assert_allclose(record_to_state(arrays)["w"], np.full(4, 1 + 0.7 / 3), rtol=1e-6)
    assert list(wrapped.round_record["rejected"]) == ["c2"]
    assert wrapped.round_record["capped"] == {"c3": pytest.approx(0.4)}
    assert wrapped.round_record["norm_cap"] == pytest.approx(0.8)


def test_around_fedavg_the_sign_vote_and_an_empty_list() -> None:
    # Prepare: deltas +0.3, +0.3, -0.3 (examples 10 each): two agree on every coordinate
    def run(defences: str, guards: Guards) -> np.ndarray:
        wrapped = configured(Defended(FedAvg(fraction_train=1.0), defences, guards))
        arrays, _ = wrapped.aggregate_train(1, [reply(0.3, "a", 1), reply(0.3, "b", 2),
                                                reply(-0.3, "c", 3)])
        assert arrays is not None
        return record_to_state(arrays)["w"]

    # Execute
    plain = run("none", Guards(robust_lr_threshold=2))
    kept = run("robust-lr", Guards(robust_lr_threshold=1))
    reversed_ = run("robust-lr", Guards(robust_lr_threshold=2))
    # Assert: FedAvg's step is +0.1 (the list "none" ignores the key); |sum of signs| = 1 is
    # at least theta = 1 (kept) and below theta = 2 (the step reversed)
    np.testing.assert_allclose(plain, np.full(4, 1.1), rtol=1e-6)
    np.testing.assert_allclose(kept, np.full(4, 1.1), rtol=1e-6)
    np.testing.assert_allclose(reversed_, np.full(4, 0.9), rtol=1e-6)


def test_a_step_left_unchanged_passes_the_very_reply_on() -> None:
    # Prepare: a guard that records what it sees and changes nothing
    seen: list[Any] = []

    class Spy(Guard):
        name = "spy"

        def screen(self, round_: Any, view: Any) -> Any:
            seen.extend(u.client_id for u in round_.updates)
            return round_

    class Inner(FedAvg):
        def aggregate_train(self, server_round: int, replies: Any) -> Any:
            seen.append(list(replies))
            return super().aggregate_train(server_round, seen[-1])

    replies = [reply(0.3, "b", 2), reply(0.1, "a", 1)]
    wrapped = configured(Defended(Inner(fraction_train=1.0), [Spy()]))
    # Execute
    wrapped.aggregate_train(1, replies)
    # Assert: the step saw the round in client-id order; FedAvg got the same message objects
    assert seen[:2] == ["a", "b"]
    assert seen[2] == replies and all(a is b for a, b in zip(seen[2], replies, strict=True))


def guide_blocks() -> list[str]:
    """The python blocks of docs/defences.md's "Adding a defence": the module, then its row."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "defences.md").read_text()
    section = text.split("## Adding a defence", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.fixture
def guide_row(monkeypatch: pytest.MonkeyPatch) -> type[Guard]:
    """The guide's example module and its row, registered as one more row of ``DEFENCES``."""
    module, row = guide_blocks()
    namespace: dict[str, Any] = {}
    exec(compile(module, "docs/defences.md", "exec"), namespace)
    spec = eval(row.strip().rstrip(","), {**namespace, "DefenceSpec": table.DefenceSpec})
    monkeypatch.setattr(table, "DEFENCES", MappingProxyType({**table.DEFENCES, spec.name: spec}))
    return namespace["CoordinateClip"]


def test_the_guides_defence_is_one_module_and_one_row(guide_row: type[Guard]) -> None:
    # Prepare: deltas 0.05 and 0.5 (equal examples) around FedAvg; the same updates in
    # FedOwen's screen with the guide's list
    listed = "identity norm-ratio coordinate-clip norm-cap links statistics-rule"
    updates = [ClientUpdate(i, f"c{i}", {"w": GLOBAL["w"] + d}, 10, 0.0)
               for i, d in enumerate(np.float32([0.05, 0.5]))]
    wrapped = configured(Defended(FedAvg(fraction_train=1.0), ["coordinate-clip"]))
    # Execute
    cfg = parse_run_config({"defences": listed})
    arrays, _ = wrapped.aggregate_train(1, [reply(0.05, "a", 1), reply(0.5, "b", 2)])
    screened = guard_round(updates, GLOBAL, Guards(), norm_cap="median", value_players=True,
                           defences=table.build(cfg.defences, fedowen=True))
    # Assert: the run config takes the name; FedAvg averages 0.05 and the clip's 0.1; FedOwen's
    # round sees c1 clipped too (its norm 0.2 then at the norm cap, 2 x lower-median(0.1, 0.2))
    assert [type(g).__name__ for g in table.build(listed, fedowen=True)][2] == "CoordinateClip"
    assert arrays is not None
    np.testing.assert_allclose(record_to_state(arrays)["w"], np.full(4, 1.075), rtol=1e-6)
    np.testing.assert_allclose(screened.updates[1].state["w"], np.full(4, 1.1), rtol=1e-6)
    assert screened.record["norm_cap"] == pytest.approx(0.2)


def test_the_adaptive_attacker_reads_only_the_bounds_the_list_applies() -> None:
    # Prepare
    guards = Guards(update_bound="clip")
    # Execute
    full = table.in_force(guards, "median", table.build("auto", fedowen=True))
    bare = table.in_force(guards, "median", table.build("links statistics-rule", fedowen=True))
    # Assert
    assert full == (guards, "median")
    assert bare[1] == "none" and bare[0].max_norm_ratio == 0.0
    assert bare[0].update_bound == "none"


def test_the_guides_wrapper_example_builds() -> None:
    # Prepare
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "defences.md").read_text()
    section = text.split("## Around Flower's strategies", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict[str, Any] = {}
    # Execute
    exec(compile(block, "docs/defences.md", "exec"), namespace)
    # Assert
    strategy = namespace["strategy"]
    assert [d.name for d in strategy.defences] == ["norm-ratio", "norm-cap", "statistics-cap",
                                                   "statistics-rule"]
    assert strategy.norm_cap == "median" and isinstance(strategy.strategy, FedAvg)


def test_around_fedavg_the_identity_step_refuses_an_impostor() -> None:
    # Prepare: nodes 1000 and 1001 are connected; 1000 names itself "a" in round 1, then in
    # round 2 node 1001 also claims "a" beside its own honest reply
    wrapped = configured(Defended(FedAvg(fraction_train=1.0), ["identity"]), nodes=2)
    wrapped.aggregate_train(1, [reply(0.1, "a", 1000), reply(0.2, "b", 1001)])
    configured(wrapped, nodes=2)
    # Execute
    arrays, _ = wrapped.aggregate_train(2, [reply(0.1, "a", 1000), reply(0.9, "a", 1001)])
    # Assert: the impostor's reply is refused under its own node, FedAvg averages the other
    assert list(wrapped.round_record["rejected"]) == ["node:1001"]
    assert arrays is not None
    np.testing.assert_allclose(record_to_state(arrays)["w"], np.full(4, 1.1), rtol=1e-6)
