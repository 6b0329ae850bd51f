"""Bound identities and Sybil copies: the book by hand, then through FedOwen's rounds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.identity import IdentityBook
from fedowen_strategy.defences.links import duplicate_groups
from fedowen_strategy.replies import record_to_state, state_to_record
from fedowen_strategy.round.contribution import ValuationSettings, value_round
from server_app.store.records import read_rounds
from tests.test_strategy import BARE, TARGET, run_toy

TARGET_4 = np.array([1.0, -2.0, 0.5, 3.0])


def test_book_binds_first_claim_and_refuses_switches_and_impostors() -> None:
    book = IdentityBook()
    assert book.claim(1, "a", connected=[1, 2]) is None
    assert book.claim(1, "a", connected=[1, 2]) is None
    assert "cannot switch" in str(book.claim(1, "b", connected=[1, 2]))
    assert "bound to connected node 1" in str(book.claim(2, "a", connected=[1, 2]))
    assert book.client_of_node == {1: "a"}
    # node 1 left: its id may be bound again (a restarted node)
    assert book.claim(3, "a", connected=[2, 3]) is None
    assert book.client_of_node == {3: "a"}


def test_duplicate_groups_and_shared_weight_by_hand() -> None:
    ref = {"w": np.zeros(3, np.float32)}
    states = [{"w": np.array([1.0, 0, 0], np.float32)},
              {"w": np.array([1.0, 0.01, 0], np.float32)},   # 1% away from state 0
              {"w": np.array([0.0, 1.0, 0], np.float32)},
              {"w": np.zeros(3, np.float32)}, {"w": np.zeros(3, np.float32)}]  # two unchanged
    groups = duplicate_groups(states, ref, tolerance=0.05)
    # two unchanged models are nobody's copies (null players, or honest clients with nothing
    # left to learn); 0 and 1 are 1% apart
    assert groups == [[0, 1]]
    assert duplicate_groups(states, ref, tolerance=0.009) == []
    assert duplicate_groups(states, ref, tolerance=0.0) == []
    # each group plays as one player of three, its equal weight 1/3 split among its members
    settings = ValuationSettings(method="none", aggregation="uniform")
    val = value_round(states, [1] * 5, ref, settings, None, np.random.default_rng(0),
                      groups=[[0, 1], [3, 4]])
    np.testing.assert_allclose(val.weights, [1 / 6, 1 / 6, 1 / 3, 1 / 6, 1 / 6])


def _every_pair(states: list[dict[str, Any]], ref: dict[str, Any],
                tolerance: float) -> list[tuple[int, int]]:
    """The rule measured on every pair's flat deltas (what the Gram screen must agree with)."""
    d = [np.concatenate([(np.asarray(s[k], np.float64) - ref[k]).ravel() for k in ref])
         for s in states]
    n = [np.linalg.norm(x) for x in d]
    return [(i, j) for i in range(len(d)) for j in range(i + 1, len(d)) if n[i] > 0
            and n[j] > 0 and np.linalg.norm(d[i] - d[j]) <= tolerance * max(n[i], n[j])]


@pytest.mark.parametrize("tolerance", [1e-6, 1e-3, 0.05])
def test_duplicate_screen_decides_pairs_at_the_tolerance_as_measuring_every_pair(
        tolerance: float) -> None:
    # Prepare: pairs just inside and just outside the tolerance (relative 1 -/+ 1e-3), in a
    # model of two arrays of 20k entries, so the Gram's rounding is far above eps
    rng = np.random.default_rng(3)
    ref = {"a": rng.normal(size=(100, 100)).astype(np.float32),
           "b": rng.normal(size=10_000).astype(np.float32)}
    base = {k: rng.normal(size=v.shape) for k, v in ref.items()}
    unit = {k: rng.normal(size=v.shape) for k, v in ref.items()}
    dot = sum(np.sum(base[k] * unit[k]) for k in ref)
    norm_sq = sum(np.sum(v ** 2) for v in base.values())
    unit = {k: unit[k] - dot / norm_sq * base[k] for k in ref}  # orthogonal to base
    scale = np.sqrt(norm_sq / sum(np.sum(v ** 2) for v in unit.values()))

    def at(t: float) -> dict[str, Any]:
        """base + an orthogonal step: distance t x the larger norm (r / sqrt(1 + r^2) = t)."""
        r = t / np.sqrt(1 - t ** 2)
        return {k: ref[k] + base[k] + unit[k] * r * scale for k in ref}

    states = [at(0.0), at(tolerance * (1 - 1e-3)), at(tolerance * (1 + 1e-3)),
              {k: ref[k] + rng.normal(size=v.shape) for k, v in ref.items()}, dict(ref)]
    # Execute
    groups = duplicate_groups(states, ref, tolerance)
    # Assert: the inside pair is a copy, the outside one and the unchanged model are not, as
    # the rule measured on every pair says
    exact = _every_pair(states, ref, tolerance)
    assert (0, 1) in exact and (0, 2) not in exact
    assert groups == [[0, 1]] or (groups == [[0, 1, 2]] and (1, 2) in exact)


def impostor_handler(msg: Message, ctx: Context) -> Message:
    """The toy client, except that node 5 names itself ``c0`` (another node's id)."""
    pid = int(ctx.node_config["partition-id"])
    name = "c0" if pid == 5 else f"c{pid}"
    if msg.metadata.message_type == "query":
        return Message(RecordDict({"client": ConfigRecord({"client-id": name})}), reply_to=msg)
    w = record_to_state(msg.content["arrays"])["w"]
    copy_of = int(ctx.node_config.get("copy-of", -1))
    src = 0 if pid == copy_of else pid
    new = {"w": (w + 0.5 * (TARGET - w) + 0.3 * src * np.eye(4)[src % 4]).astype(np.float32)}
    return Message(RecordDict({"arrays": state_to_record(new),
                               "metrics": MetricRecord({"num-examples": 10, "train-loss": 1.0}),
                               "client": ConfigRecord({"client-id": name})}), reply_to=msg)


def test_impostor_is_refused_and_never_costs_the_victim(tmp_path: Any) -> None:
    # Execute: 6 nodes, all selected each round; node 5 claims c0's id (Algorithm 2: its
    # memory counts the credited returns)
    strategy = run_toy("owen", rounds=2, k=5, tmp_path=tmp_path, handler=impostor_handler,
                       selection="adaptive")
    # Assert: c0 credited with its own reply every round it was selected; the impostor never
    # selected (refused at identification), and not in the ledger
    rounds = read_rounds(tmp_path)
    assert all(r["returned"].count("c0") <= 1 for r in rounds[1:])
    assert strategy.chooser.selector.counts.get("c0") == 2
    assert len(strategy.roster.refused) == 1 and "c5" not in strategy.chooser.selector.counts
    assert sorted(strategy.client_of_node.values()) == ["c0", "c1", "c2", "c3", "c4"]


def test_copied_updates_share_one_weight(tmp_path: Any) -> None:
    strategy = run_toy("owen", rounds=1, k=6, tmp_path=tmp_path, node_extra={"copy-of": 3},
                       handler=impostor_handler,
                       duplicate_tolerance=0.05, aggregation="uniform")
    record = read_rounds(tmp_path)[1]
    assert record["duplicates"] == [["c0", "c3"]]
    w = record["weights"]
    assert w["c0"] == pytest.approx(w["c3"]) and w["c0"] + w["c3"] == pytest.approx(w["c1"])
    assert strategy.guards.duplicate_tolerance == 0.05


def test_copies_are_linked_never_selected_again_and_forfeit_their_pay(tmp_path: Any) -> None:
    from server_app.store.payouts import run_payouts

    # Execute: node 3 returns node 0's update; every selectable client is selected each round
    strategy = run_toy("owen", rounds=3, k=6, tmp_path=tmp_path, node_extra={"copy-of": 3},
                       handler=impostor_handler, duplicate_tolerance=1e-6)
    rounds = read_rounds(tmp_path)
    # Assert: caught in round 1, then left out of selection (c5 is refused as an impostor)
    assert rounds[1]["duplicates"] == [["c0", "c3"]]
    assert strategy.linked == {"c0", "c3"}
    assert all(sorted(r["selected"]) == ["c1", "c2", "c4"] for r in rounds[2:])
    # the link survives a checkpoint
    state = strategy.state_dict()
    again = run_toy("owen", rounds=0, k=6)
    again.load_state_dict(state)
    assert again.linked == {"c0", "c3"}
    # the ledger keeps their phi but pays them nothing
    ledger = {p.client_id: p for p in run_payouts(tmp_path)}
    assert ledger["c0"].forfeited and ledger["c3"].forfeited and not ledger["c1"].forfeited
    assert ledger["c0"].paid_phi == min(ledger["c0"].total_phi, 0.0)
    assert ledger["c0"].payout_share == ledger["c3"].payout_share == 0.0


def same_update_handler(msg: Message, ctx: Context) -> Message:
    """Every node returns the same update (clients sharing data and seed)."""
    name = f"c{int(ctx.node_config['partition-id'])}"
    if msg.metadata.message_type == "query":
        return Message(RecordDict({"client": ConfigRecord({"client-id": name})}), reply_to=msg)
    w = record_to_state(msg.content["arrays"])["w"]
    new = {"w": (w + 0.5 * (TARGET - w)).astype(np.float32)}
    return Message(RecordDict({"arrays": state_to_record(new),
                               "metrics": MetricRecord({"num-examples": 10, "train-loss": 1.0}),
                               "client": ConfigRecord({"client-id": name})}), reply_to=msg)


def test_a_federation_of_copies_keeps_its_model_and_says_why(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    # Execute: all six clients return one update in round 1, so all are linked
    strategy = run_toy("owen", rounds=3, k=6, tmp_path=tmp_path, handler=same_update_handler,
                       duplicate_tolerance=1e-6)
    # Assert: rounds 2-3 select nobody and keep round 1's model, with the reason logged
    rounds = read_rounds(tmp_path)
    assert len(strategy.linked) == 6
    assert [r["selected"] for r in rounds[2:]] == [[], []]
    assert rounds[3]["distance"] == pytest.approx(rounds[1]["distance"])
    assert "none of the 6 connected nodes may be selected" in caplog.text


def test_a_clientapp_without_a_query_handler_is_asked_once() -> None:
    # Prepare: Flower's quickstart ClientApp registers train and evaluate only; its
    # runtime answers a query with "No query function registered"
    from fedowen_strategy.strategy import FedOwen
    from sim.inline_grid import InProcessGrid

    queries: list[int] = []

    def quickstart(msg: Message, ctx: Context) -> Message:
        if msg.metadata.message_type == "query":
            queries.append(int(ctx.node_config["partition-id"]))
            raise ValueError("No query function registered with name 'default'")
        w = record_to_state(msg.content["arrays"])["w"]
        new = {"w": (w + 0.5 * (TARGET - w)).astype(np.float32)}
        return Message(RecordDict({"arrays": state_to_record(new), "metrics": MetricRecord(
            {"num-examples": 10, "train-loss": 1.0})}), reply_to=msg)

    rounds: list[dict[str, Any]] = []
    strategy = FedOwen(clients_per_round=4, valuation=ValuationSettings(method="none"),
                       guards=Guards(**BARE), seed=0,
                       on_round=lambda r, rec, rows: rounds.append(rec))
    # Execute: 8 nodes, 5 rounds
    strategy.start(grid=InProcessGrid(quickstart, [{"partition-id": i} for i in range(8)]),
                   initial_arrays=state_to_record({"w": np.zeros(4, np.float32)}),
                   num_rounds=5)
    # Assert: one query in the whole run, every round trained 4 nodes labelled by node id
    assert len(queries) == 1 and strategy.roster.unanswered
    assert [len(r["returned"]) for r in rounds] == [4] * 5
    assert all(c.startswith("node:") for r in rounds for c in r["returned"])


@pytest.mark.parametrize("selection", ["adaptive", "auto"])
def test_a_quickstart_clientapp_under_fedowen_explores_every_node(selection: str) -> None:
    # Prepare: Flower's quickstart shape (train only, no query handler, no client id), 8
    # nodes, Algorithm 2 or the default selection (hics-phi: one cluster, the model has no
    # output bias) and a game it can value
    from fedowen_strategy.strategy import FedOwen
    from sim.inline_grid import InProcessGrid
    from tests.test_defences import delta_utility

    def quickstart(msg: Message, ctx: Context) -> Message:
        if msg.metadata.message_type == "query":
            raise ValueError("No query function registered with name 'default'")
        pid = int(ctx.node_config["partition-id"])
        w = record_to_state(msg.content["arrays"])["w"]
        new = {"w": (w + 0.5 * (TARGET_4 - w) + 0.05 * np.eye(4)[pid % 4]).astype(np.float32)}
        return Message(RecordDict({"arrays": state_to_record(new), "metrics": MetricRecord(
            {"num-examples": 10, "train-loss": 1.0})}), reply_to=msg)

    rounds: list[dict[str, Any]] = []
    strategy = FedOwen(clients_per_round=4, utility_factory=delta_utility,
                       valuation=ValuationSettings(method="exact", game="delta"),
                       guards=Guards(**BARE), seed=0, selection=selection,
                       on_round=lambda r, rec, rows: rounds.append(rec))
    # Execute: 10 rounds
    strategy.start(grid=InProcessGrid(quickstart, [{"partition-id": i} for i in range(8)]),
                   initial_arrays=state_to_record({"w": np.zeros(4, np.float32)}),
                   num_rounds=10)
    # Assert: every round trained 4 nodes, and at least 7 of the 8 were chosen at some point
    # (Algorithm 2's shift by the minimum had left the never-valued half at probability 0)
    assert [len(r["returned"]) for r in rounds] == [4] * 10
    assert len({c for r in rounds for c in r["selected"]}) >= 7


def test_the_copies_screen_reads_the_norms_it_is_given() -> None:
    # Prepare: two identical updates (norm 5) and a third of another direction, same norm
    ref = {"w": np.zeros(2, np.float32)}
    states = [{"w": np.array([3.0, 4.0], np.float32)}, {"w": np.array([3.0, 4.0], np.float32)},
              {"w": np.array([4.0, 3.0], np.float32)}]
    # Execute
    measured = duplicate_groups(states, ref, 1e-6)
    given = duplicate_groups(states, ref, 1e-6, norms=[5.0, 5.0, 5.0])
    apart = duplicate_groups(states, ref, 1e-6, norms=[5.0, 6.0, 5.0])
    # Assert: the copies found with the norms measured or given; the same norm in another
    # direction is no copy (measured: distance sqrt(2)); norms 5 and 6 cannot be copies at a
    # tolerance of 1e-6 (the triangle inequality), so that pair is never measured
    assert measured == given == [[0, 1]]
    assert apart == []
