"""Omniscient attacks (fedowen_task.adversary.server) at the ServerApp's message boundary
(server_app.byzantine)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fedowen_strategy.defences.bounds import lower_median
from fedowen_strategy.defences.guard_settings import Defence
from fedowen_strategy.replies import CLIENT_ID_FIELD, CLIENT_RECORD_KEY, state_to_record
from fedowen_task.adversary.attacks import kinds, server_side
from fedowen_task.adversary.keys import adversary_ids
from fedowen_task.adversary.server import (
    adaptive_scale,
    alie_vector,
    baruch_z,
    honest_alignment,
    ipm_vector,
    jittered,
    median_faced,
)
from fedowen_task.config import ConfigError
from server_app.byzantine import ByzantineGrid, attacker_bound
from server_app.config import RunConfig, parse_run_config
from sim.inline_grid import InProcessGrid

HONEST = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 4.0]])  # mean (3, 4), population std sqrt(8/3)


# Pure functions

def test_alie_vector_is_mean_minus_z_std() -> None:
    # Execute
    out = alie_vector(HONEST, 1.5)
    # Assert: (3, 4) - 1.5 * sqrt(8/3) in each coordinate, within z std of the mean
    std = np.sqrt(8 / 3)
    np.testing.assert_allclose(out, [3 - 1.5 * std, 4 - 1.5 * std])
    assert np.all(np.abs(out - HONEST.mean(axis=0)) <= 1.5 * HONEST.std(axis=0) + 1e-12)
    np.testing.assert_array_equal(alie_vector(HONEST, 0.0), [3.0, 4.0])


def test_ipm_vector_opposes_the_honest_mean() -> None:
    out = ipm_vector(HONEST, 0.5)
    np.testing.assert_allclose(out, [-1.5, -2.0])
    # inner product with the mean (3, 4): -0.5 * ||(3, 4)||^2 = -12.5
    assert float(out @ HONEST.mean(axis=0)) == pytest.approx(-12.5)


@pytest.mark.parametrize(("n", "m", "z"), [
    (10, 2, 0.253347),   # s = 6 - 2 = 4: Phi^-1(0.6)
    (50, 12, 0.582842),  # s = 26 - 12 = 14: Phi^-1(0.72)
    (50, 24, 1.750686),  # s = 2: Phi^-1(0.96)
    (10, 1, 0.0),        # s = 5: Phi^-1(0.5)
    (4, 3, 0.674490),    # s = 3 - 3 = 0, kept at 1: Phi^-1(0.75)
    (1, 1, 0.0),         # a lone reply: nothing to hide among
])
def test_baruch_z_matches_the_paper(n: int, m: int, z: float) -> None:
    assert baruch_z(n, m) == pytest.approx(z, abs=1e-6)


def test_baruch_z_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match=r"n=3, m=4"):
        baruch_z(3, 4)


def test_adaptive_scale_sits_just_under_the_bound() -> None:
    assert adaptive_scale(2.0, 10.0, boost=2.5) == pytest.approx(4.95)  # norm 9.9 = 0.99 x 10
    assert adaptive_scale(20.0, 10.0, boost=2.5) == pytest.approx(0.495)  # scaled down too
    assert adaptive_scale(2.0, None, boost=2.5) == 2.5
    assert adaptive_scale(0.0, 10.0, boost=2.5) == 1.0


# norms (1, 2, 4, 0) of 10, 10, 20, 5 examples: per example (0.1, 0.2, 0.2, 0)
NORMS, EXAMPLES = [1.0, 2.0, 4.0, 0.0], [10, 10, 20, 5]
OFF = {"max_norm_ratio": 0.0, "update_bound": "none", "norm_cap": "none"}


def defence_of(cfg: RunConfig) -> Defence | None:
    """What the ServerApp hands the attacker: FedOwen's guards and norm cap, or None."""
    return (cfg.guards(), cfg.choices().norm_cap) if cfg.strategy == "fedowen" else None


@pytest.mark.parametrize(("settings", "bound"), [
    ({**OFF, "max_norm_ratio": 10.0}, 30.0),                  # 10 x ||global|| = 3
    ({**OFF, "update_bound": "clip"}, 30.0),                  # 3 x 0.2 x 50 examples
    ({**OFF, "update_bound": "reject", "update_bound_multiple": 2.0}, 20.0),
    ({**OFF, "norm_cap": "median", "norm_cap_multiple": 1.5}, 3.0),  # 1.5 x median(1, 2, 4)
    ({**OFF, "norm_cap": "server"}, 4.0),                     # 2 x the median as the estimate
    ({"max_norm_ratio": 0.5, "update_bound": "clip", "norm_cap": "median"}, 1.5),  # tightest
    ({"norm_cap": "auto"}, 4.0),                    # auto = 2 x median(1, 2, 4)
    ({"norm_cap": "auto", "max_norm_ratio": 1.0}, 3.0),       # the tighter: 1 x ||global||
    ({"norm_cap": "auto", "valuation": "none", "max_norm_ratio": 0.0}, None),
    (OFF, None),
    ({"strategy": "fltrust"}, None),                          # rescaled to the server's norm
    ({"strategy": "fedavg"}, None),                           # FedOwen's bounds do not apply
])
def test_attacker_bound(settings: dict[str, Any], bound: float | None) -> None:
    cfg = RunConfig(**settings)
    out = attacker_bound(defence_of(cfg), NORMS, EXAMPLES, own_examples=50, global_norm=3.0)
    assert out == (None if bound is None else pytest.approx(bound))


def test_new_kinds_and_keys_are_validated() -> None:
    assert {"sign-flip", *server_side()} <= set(kinds())
    assert server_side() == ("alie", "ipm", "adaptive", "adaptive-backdoor")
    cfg = parse_run_config({"adversary-kind": "alie", "adversary-alie-z": 1,
                            "adversary-ipm-epsilon": 0.1})
    assert cfg.adversary_alie_z == 1.0 and cfg.adversary_ipm_epsilon == 0.1
    with pytest.raises(ConfigError) as err:
        parse_run_config({"adversary-kind": "ipn", "adversary-alie-z": -1.0,
                          "adversary-ipm-epsilon": 0.0})
    text = str(err.value)
    assert "adversary-alie-z=-1.0 must be" in text and "(did you mean 'ipm'?)" in text
    assert "adversary-ipm-epsilon=0.0 must be a finite number > 0" in text


# The grid wrapper

N = 5  # partitions; node 1000 + i serves partition i
GLOBAL: dict[str, np.ndarray] = {"w": np.array([1.0, -2.0, 0.5], dtype=np.float32),
                                 "n": np.array([7], dtype=np.int64)}


def _delta(pid: int) -> np.ndarray:
    """Partition ``pid``'s honest update: distinct per client, exact in float32."""
    return np.array([pid + 1, -(pid % 3), 0.25 * pid], dtype=np.float32)


def _handler(msg: Message, context: Context) -> Message:
    """A ClientApp in miniature: names itself; 'trains' by adding its fixed update."""
    pid = int(context.node_config["partition-id"])
    content = RecordDict({CLIENT_RECORD_KEY: ConfigRecord({CLIENT_ID_FIELD: str(pid)})})
    if msg.metadata.message_type == MessageType.TRAIN:
        glob = {k: a.numpy() for k, a in msg.content.array_records["arrays"].items()}
        content["arrays"] = state_to_record({"w": glob["w"] + _delta(pid), "n": glob["n"] + pid})
        content["metrics"] = MetricRecord({"num-examples": 10 * (pid + 1), "train-loss": 0.1})
    return Message(content=content, reply_to=msg)


def _grid(kind: str, fraction: float = 0.4, **settings: Any
          ) -> tuple[ByzantineGrid, list[dict[str, Any]]]:
    inner = InProcessGrid(_handler, [{"partition-id": i} for i in range(N)])
    cfg = RunConfig(adversary_kind=kind, adversary_fraction=fraction, seed=0, **settings)
    seen: list[dict[str, Any]] = []
    grid = ByzantineGrid(inner, cfg, N, on_round=lambda r, entry: seen.append(entry),
                         defence=defence_of(cfg))
    return grid, seen


def _send(grid: ByzantineGrid, message_type: str = MessageType.TRAIN,
          nodes: Sequence[int] = range(N)) -> dict[str, Message]:
    record = state_to_record({k: v.copy() for k, v in GLOBAL.items()})
    messages = [grid.create_message(RecordDict({"arrays": record, "config": ConfigRecord(
        {"server-round": 3})}), message_type, 1000 + i, "3") for i in nodes]
    return {r.content.config_records[CLIENT_RECORD_KEY][CLIENT_ID_FIELD]: r  # type: ignore[misc]
            for r in grid.send_and_receive(messages)}


def _arrays(reply: Message) -> dict[str, np.ndarray]:
    return {k: a.numpy() for k, a in reply.content.array_records["arrays"].items()}


BAD = sorted(adversary_ids(N, 0.4, 0))
GOOD = sorted(set(range(N)) - set(BAD))


def test_grid_replaces_only_the_adversaries_train_replies() -> None:
    # Prepare: 2 of 5 adversaries (IPM, epsilon 0.5)
    grid, seen = _grid("ipm")
    assert len(BAD) == 2
    # Execute
    replies = _send(grid)
    # Assert: honest replies bit-identical to what the clients sent
    for pid in GOOD:
        out = _arrays(replies[str(pid)])
        assert out["w"].tobytes() == (GLOBAL["w"] + _delta(pid)).tobytes()
        assert out["n"].tolist() == [7 + pid]
    # every attacker sends global - 0.5 x the honest mean update; its own counter
    mean = np.mean([_delta(p) for p in GOOD], axis=0, dtype=np.float64)
    for pid in BAD:
        out = _arrays(replies[str(pid)])
        np.testing.assert_allclose(out["w"], GLOBAL["w"] - 0.5 * mean, rtol=1e-6)
        assert out["w"].dtype == np.float32 and out["n"].tolist() == [7 + pid]
    # recorded: one entry for round 3, the attackers, epsilon and the norm sent
    assert seen == grid.log and len(seen) == 1
    entry = seen[0]
    assert entry["round"] == 3 and entry["clients"] == [str(p) for p in BAD]
    assert entry["epsilon"] == 0.5 and entry["statistics_from"] == "honest"
    assert entry["norms"] == pytest.approx([0.5 * np.linalg.norm(mean)] * 2)


def test_grid_alie_with_z_max_of_the_round() -> None:
    grid, seen = _grid("alie")
    replies = _send(grid)
    honest = np.array([_delta(p) for p in GOOD], dtype=np.float64)
    z = baruch_z(5, 2)  # s = 1, Phi^-1(0.8) = 0.8416
    assert seen[0]["z"] == pytest.approx(0.841621, abs=1e-6)
    for pid in BAD:
        np.testing.assert_allclose(_arrays(replies[str(pid)])["w"],
                                   GLOBAL["w"] + honest.mean(0) - z * honest.std(0), rtol=1e-6)


@pytest.mark.parametrize(("multiple", "rank"), [(1.0, 0), (2.0, 2)])
def test_grid_adaptive_sits_under_the_norm_cap(multiple: float, rank: int) -> None:
    # Prepare: FedOwen with norm-cap median only; 2 attackers, 3 honest clients. The cap is
    # multiple x the lower median (3rd of 5) of the norms the server receives: attackers
    # just under 1 x it rank below it (the smallest honest norm is the median they face),
    # attackers at 2 x it rank above it (the largest honest norm is)
    grid, seen = _grid("adaptive", max_norm_ratio=0.0, norm_cap="median",
                       norm_cap_multiple=multiple)
    good = sorted(float(np.linalg.norm(_delta(p))) for p in GOOD)
    # Execute
    replies = _send(grid)
    # Assert: every attacker's update has norm 0.99 x the cap the server will compute from
    # what it receives, in its own honest direction
    cap = multiple * good[rank]
    sent = []
    for pid in BAD:
        delta = _arrays(replies[str(pid)])["w"].astype(np.float64) - GLOBAL["w"]
        sent.append(float(np.linalg.norm(delta)))
        assert sent[-1] == pytest.approx(0.99 * cap, rel=1e-6)
        cosine = delta @ _delta(pid) / (np.linalg.norm(delta) * np.linalg.norm(_delta(pid)))
        assert cosine == pytest.approx(1.0)
    assert seen[0]["bounds"] == pytest.approx([cap] * 2)
    assert multiple * lower_median([*good, *sent]) == pytest.approx(cap, rel=1e-6)


def test_grid_falls_back_to_the_attackers_own_updates() -> None:
    # Prepare: a round of the two attackers and one honest client
    grid, seen = _grid("ipm")
    # Execute
    replies = _send(grid, nodes=[*BAD, GOOD[0]])
    # Assert: with one honest reply the statistics are the attackers' own updates
    mean = np.mean([_delta(p) for p in BAD], axis=0, dtype=np.float64)
    assert seen[0]["statistics_from"] == "attackers"
    np.testing.assert_allclose(_arrays(replies[str(BAD[0])])["w"], GLOBAL["w"] - 0.5 * mean,
                               rtol=1e-6)


@pytest.mark.parametrize("message_type", [MessageType.QUERY, MessageType.EVALUATE])
def test_grid_passes_other_messages_through(message_type: str) -> None:
    grid, seen = _grid("ipm")
    replies = _send(grid, message_type)
    assert sorted(replies) == [str(p) for p in range(N)] and seen == []
    assert all("arrays" not in r.content.array_records for r in replies.values())


def test_grid_delegates_to_the_inner_grid() -> None:
    grid, _ = _grid("alie")
    assert list(grid.get_node_ids()) == [1000 + i for i in range(N)]
    assert grid.run is None and grid.sent == []  # an attribute only the inner grid has
    with pytest.raises(ValueError, match="adversary-kind='noise'"):
        ByzantineGrid(grid.inner, RunConfig(adversary_kind="noise"), N)


def test_jitter_keeps_the_attack_but_breaks_the_copies() -> None:
    # Prepare: two attackers with one ALIE vector
    base = np.tile(alie_vector(HONEST, 1.0), (2, 1))
    # Execute
    out = jittered(base, 0.01, seed=3, server_round=5, clients=["7", "8"])
    again = jittered(base, 0.01, seed=3, server_round=5, clients=["7", "8"])
    # Assert: seeded; each row 1% of its norm from the vector, and the rows differ
    np.testing.assert_array_equal(out, again)
    for row in out:
        assert np.linalg.norm(row - base[0]) == pytest.approx(0.01 * np.linalg.norm(base[0]))
    assert not np.allclose(out[0], out[1])
    np.testing.assert_array_equal(base, np.tile(alie_vector(HONEST, 1.0), (2, 1)))  # untouched


def test_attacker_bound_under_the_server_cap_is_the_servers_step() -> None:
    cfg = RunConfig(**{**OFF, "norm_cap": "server", "norm_cap_multiple": 1.5})
    out = attacker_bound(defence_of(cfg), NORMS, EXAMPLES, own_examples=50, global_norm=3.0,
                         server_norm=5.0)
    assert out == pytest.approx(7.5)  # 1.5 x the server step's norm, not the median's 2


@pytest.mark.parametrize("factor", [0.99, 1.98, 2.97])
@pytest.mark.parametrize("attackers", [1, 2, 3, 5])
def test_median_faced_is_the_median_the_server_computes_after_the_attack(
        factor: float, attackers: int) -> None:
    # Prepare: honest norms of a 10-reply round (some zero: free riders do not count)
    rng = np.random.default_rng(attackers)
    others = [*rng.uniform(0.5, 3.0, 10 - attackers - 1), 0.0]
    # Execute
    faced = median_faced(others, attackers, factor)
    # Assert: the attackers sending factor x it leave the server exactly that median; the
    # median of the honest norms alone is another number (below it when they send more)
    if faced is None:
        assert lower_median([*others, *[1e9] * attackers]) == 1e9  # they would set it
        return
    assert lower_median([*others, *[factor * faced] * attackers]) == pytest.approx(faced)
    if factor > 1:
        assert faced >= lower_median(others)


def test_median_faced_leaves_the_bound_to_attackers_holding_the_median() -> None:
    assert median_faced([1.0, 2.0], attackers=3, factor=1.98) is None
    assert median_faced([1.0, 2.0], attackers=3, factor=0.99) is None
    assert median_faced([1.0, 2.0, 3.0, 4.0], attackers=1, factor=1.98) == 3.0


def test_the_adaptive_backdoor_reads_the_round_without_an_honest_reply_holding_nan() -> None:
    # Prepare: one honest client's training diverged (its reply holds NaN), which the strategy
    # rejects before any defence reads it; before the fix the honest mean was NaN and the
    # attacker raised "a cosine must lie in [-1, 1], got nan" (backdoor-defaults-dev, FLAME)
    diverged = GOOD[0]

    def handler(msg: Message, context: Context) -> Message:
        reply = _handler(msg, context)
        if int(context.node_config["partition-id"]) == diverged and reply.has_content():
            state = _arrays(reply)
            reply.content["arrays"] = state_to_record({**state, "w": state["w"] * np.nan})
        return reply

    inner = InProcessGrid(handler, [{"partition-id": i} for i in range(N)])
    cfg = RunConfig(adversary_kind="adaptive-backdoor", adversary_fraction=0.4, seed=0,
                    max_norm_ratio=0.0, norm_cap="median")
    seen: list[dict[str, Any]] = []
    grid = ByzantineGrid(inner, cfg, N, on_round=lambda r, entry: seen.append(entry),
                         defence=defence_of(cfg))
    # Execute
    replies = _send(grid)
    # Assert: the attack ran on the two finite honest updates, and sent finite updates
    finite = np.array([_delta(p) for p in GOOD if p != diverged], dtype=np.float64)
    assert seen[0]["honest"] == 2 and seen[0]["replies"] == 4
    assert seen[0]["least_cosine"] == pytest.approx(honest_alignment(finite))
    for pid in BAD:
        assert np.all(np.isfinite(_arrays(replies[str(pid)])["w"]))
    assert np.isnan(_arrays(replies[str(diverged)])["w"]).all()  # passed on as it came
