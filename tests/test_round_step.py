"""One aggregation round as a pure function
(:func:`fedowen_strategy.round.round_step.aggregate_round`), run by hand: no grid, no strategy,
a list of updates and a global model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.replies import ClientUpdate, ParsedReplies
from fedowen_strategy.round.contribution import ValuationSettings, resolve_auto
from fedowen_strategy.round.round_step import aggregate_round

TARGET = np.array([1.0, -2.0, 0.5, 3.0])


def delta_game(global_state: Mapping[str, np.ndarray], states: Sequence[Mapping[str, Any]],
               examples: Sequence[int], shares: Sequence[float] = ()) -> Any:
    """Minus the distance of ``global + sum p_i d_i`` to TARGET."""
    g = global_state["w"]
    d = np.stack([s["w"] - g for s in states])
    p = np.asarray(shares)
    return lambda masks: np.array([-np.linalg.norm(g + (p * m) @ d - TARGET) for m in masks])


def round_of(boost: float, ids: Sequence[str]) -> ParsedReplies:
    """Honest clients step halfway to TARGET with a twist of their own; the first sends
    ``boost`` times its step."""
    updates = [ClientUpdate(100 + i, cid, {"w": (1.0 if i else boost)
                                           * (0.5 * TARGET + 0.05 * np.eye(4)[i % 4])}, 10, 1.0)
               for i, cid in enumerate(ids)]
    return ParsedReplies(updates=updates, failed={"c9": "node gone"})


#: The value cap off (it is on by default: 1 x the reference, exactly)
NO_VALUE_CAP: dict[str, Any] = {"value_cap_multiple": 0.0, "value_cap_mode": "at-most"}


def run(parsed: ParsedReplies, **guards: Any) -> Any:
    return aggregate_round(
        parsed, {"w": np.zeros(4)}, selected=["c0", "c1", "c2", "c3", "c4", "c9"],
        valuation=ValuationSettings(method="exact", game="delta"), guards=Guards(**guards),
        norm_cap="median", utility_factory=delta_game, rng=np.random.default_rng(0),
        server_round=3, extra={"ray_nodes": {"n1": ["c0"]}})


def test_a_hand_built_round_caps_the_booster_values_and_averages_in_client_order() -> None:
    # Prepare: five replies arriving out of id order; c0 sends 50 x its step
    parsed = round_of(50.0, ["c0", "c3", "c1", "c4", "c2"])
    arrived = list(parsed.updates)
    # Execute
    out = run(parsed, link_cosine=0.0)
    # Assert: valued and averaged in client-id order; the booster rescaled to the default cap
    # (the round's lower-median norm x 2) before it was valued
    ids = [u.client_id for u in out.parsed.updates]
    assert ids == ["c0", "c1", "c2", "c3", "c4"]
    honest = sorted(np.linalg.norm(u.state["w"]) for u in arrived if u.client_id != "c0")
    lower_median = sorted([*honest, 50 * honest[0]])[2]
    assert out.record["norm_cap"] == pytest.approx(2 * lower_median)
    assert np.linalg.norm(out.parsed.updates[0].state["w"]) == pytest.approx(
        out.record["norm_cap"])
    assert list(out.record["capped"]) == ["c0"]
    weights = dict(zip(ids, out.valuation.weights, strict=True))
    expected = sum(w * u.state["w"] for w, u in zip(out.valuation.weights, out.parsed.updates,
                                                    strict=True))
    np.testing.assert_allclose(out.state["w"], expected)
    # the record and ledger: what the ServerApp writes
    assert out.record["returned"] == ids and out.record["failed"] == {"c9": "node gone"}
    assert out.record["ray_nodes"] == {"n1": ["c0"]}
    assert [row["client_id"] for row in out.rows] == ids and out.rows[0]["round"] == 3
    assert out.rows[0]["weight"] == pytest.approx(weights["c0"])
    # the input is left as it came (the function is pure)
    assert parsed.updates == arrived and parsed.clipped == {}


def test_copies_are_reported_for_the_ban_and_share_one_weight() -> None:
    # Prepare: three honest replies, then the same round with c1's update sent again as c4
    alone = run(round_of(1.0, ["c0", "c1", "c2"]), link_cosine=0.0)
    parsed = round_of(1.0, ["c0", "c1", "c2"])
    parsed.updates.append(ClientUpdate(104, "c4", {"w": parsed.updates[1].state["w"].copy()},
                                       10, 1.0))
    # Execute
    out = run(parsed, link_cosine=0.0)
    # Assert: the pair is one player; together the copies weigh what c1 weighed alone
    assert out.copies == [["c1", "c4"]]
    weights = dict(zip([u.client_id for u in out.parsed.updates], out.valuation.weights,
                       strict=True))
    assert weights["c1"] == pytest.approx(weights["c4"])
    assert weights["c1"] + weights["c4"] == pytest.approx(alone.valuation.weights[1])
    np.testing.assert_allclose(out.state["w"], alone.state["w"])


def test_near_parallel_updates_come_back_as_the_rounds_typed_links() -> None:
    # Prepare: c1's step sent again by c4 at 1.01 x its size: parallel, but no copy (the
    # honest steps' pairwise cosines lie in 0.9993-0.9996, below the threshold)
    parsed = round_of(1.0, ["c0", "c1", "c2"])
    parsed.updates.append(ClientUpdate(104, "c4", {"w": 1.01 * parsed.updates[1].state["w"]},
                                       10, 1.0))
    # Execute
    out = run(parsed, link_cosine=0.9999)
    # Assert: linked, not banned; the strategy reads the field, rounds.jsonl the record's copy
    assert out.copies == [] and out.links == [["c1", "c4"]]
    assert out.record["links"] == out.links
    assert run(round_of(1.0, ["c0", "c1", "c2"]), link_cosine=0.9999).links == []


def test_a_round_whose_every_update_is_linked_says_so_loudly(caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    # Prepare: three honest steps at pairwise cosines 0.9993-0.9996, above link-cosine 0.98
    # (a binary task's honest clients agree like this: BreastMNIST's did in every round)
    ids = ["c0", "c1", "c2"]
    # Execute
    with caplog.at_level("INFO", logger="fedowen_strategy.defences.sybil_links"):
        whole = run(round_of(1.0, ids), link_cosine=0.98)
        part = run(round_of(1.0, ids), link_cosine=0.9995)
    # Assert: one player of three; the warning names the key to raise; a partial link does not
    assert whole.links == [ids]
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "all 3 updates are near-parallel" in warned[0].getMessage()
    assert "`link-cosine`" in warned[0].getMessage()
    assert part.links and len(part.links[0]) < 3


def test_a_round_without_usable_updates_keeps_the_global_model() -> None:
    # the one selected client failed: nothing to value
    out = run(ParsedReplies(failed={"c0": "timed out"}))
    assert out.state is None and out.valuation is None and out.rows == []
    assert out.record["returned"] == [] and out.record["failed"] == {"c0": "timed out"}


def test_a_value_cap_values_a_booster_under_the_cap_by_its_direction_not_its_size() -> None:
    # Prepare: c0 sends 1.9 x its step, under the default cap (2 x the lower-median norm); the
    # toy game rewards a longer step (the honest average only goes halfway to TARGET); four
    # clients, so no two honest steps are copies
    ids = ["c0", "c1", "c2", "c3"]
    honest = run(round_of(1.0, ids), link_cosine=0.0, **NO_VALUE_CAP)
    # Execute
    boosted = run(round_of(1.9, ids), link_cosine=0.0, **NO_VALUE_CAP)
    valued = run(round_of(1.9, ids), link_cosine=0.0, value_cap_multiple=1.0,
                 value_cap_mode="at-most")
    # Assert: without the value cap the booster's size buys it phi over every honest client;
    # valued at 1 x the reference it earns what it earns sending its honest step (within the
    # few percent its step's norm differs from the lower median), no more than the best honest
    phi = {name: dict(zip(ids, out.valuation.phi, strict=True))
           for name, out in (("honest", honest), ("boosted", boosted), ("valued", valued))}
    assert "c0" not in boosted.record["capped"]  # 1.9 x sits under the 2 x cap
    assert phi["boosted"]["c0"] > 1.5 * max(phi["boosted"][c] for c in ids[1:])
    assert phi["valued"]["c0"] == pytest.approx(phi["honest"]["c0"], rel=0.1)
    assert phi["valued"]["c0"] <= max(phi["valued"][c] for c in ids[1:]) * 1.1
    # the value cap is the same reference x 1; what is averaged is the 2 x-capped round as
    # before (the booster's step included at its size)
    assert valued.record["value_cap"] == pytest.approx(valued.record["norm_cap"] / 2)
    assert "c0" in valued.record["value_capped"]
    for a, b in zip(valued.parsed.updates, boosted.parsed.updates, strict=True):
        np.testing.assert_array_equal(a.state["w"], b.state["w"])
    expected = sum(w * u.state["w"] for w, u in zip(valued.valuation.weights,
                                                    valued.parsed.updates, strict=True))
    np.testing.assert_allclose(valued.state["w"], expected)


def scaled_round(scales: Sequence[float]) -> ParsedReplies:
    """Client ci steps ``scales[i]`` times halfway to TARGET, with a twist of its own."""
    return ParsedReplies(updates=[
        ClientUpdate(100 + i, f"c{i}", {"w": scale * (0.5 * TARGET + 0.05 * np.eye(4)[i % 4])},
                     10, 1.0) for i, scale in enumerate(scales)])


def test_valued_exactly_at_the_reference_a_booster_earns_what_its_unscaled_step_earns() -> None:
    # Prepare: c0's honest step is 0.4 x an honest one, so it stays the shortest when it
    # boosts 2 x (0.8) and the round's lower median (c1's norm) does not move; the toy game
    # rewards a longer step
    honest_scales, boosted_scales = [0.4, 1.0, 1.1, 1.2], [0.8, 1.0, 1.1, 1.2]
    # Execute
    at_most = {name: run(scaled_round(scales), link_cosine=0.0, value_cap_multiple=1.0,
                         value_cap_mode="at-most")
               for name, scales in (("honest", honest_scales), ("boosted", boosted_scales))}
    exactly = {name: run(scaled_round(scales), link_cosine=0.0, value_cap_multiple=1.0,
                         value_cap_mode="exactly")
               for name, scales in (("honest", honest_scales), ("boosted", boosted_scales))}
    # Assert: under an at-most cap the boost (still under the reference) buys c0 phi; valued
    # at exactly the reference, c0's boosted and honest updates are the same valued state, so
    # the exact game gives it the same phi and the same weight
    phi = {(mode, name): out.valuation.phi[0]
           for mode, outs in (("at-most", at_most), ("exactly", exactly))
           for name, out in outs.items()}
    assert phi["at-most", "boosted"] > phi["at-most", "honest"] + 0.05
    assert phi["exactly", "boosted"] == pytest.approx(phi["exactly", "honest"], rel=1e-9)
    np.testing.assert_allclose(exactly["boosted"].valuation.weights,
                               exactly["honest"].valuation.weights, rtol=1e-9)
    # every update was valued at the reference's norm (the short ones scaled up) and is
    # averaged as it came (none of these sits above the 2 x norm cap)
    reference = exactly["boosted"].record["value_cap"]
    c1 = scaled_round(boosted_scales).updates[1].state["w"]
    assert reference == pytest.approx(np.linalg.norm(c1))
    assert set(exactly["boosted"].record["value_capped"]) == {"c0", "c2", "c3"}  # c1: as is
    for i, upd in enumerate(exactly["boosted"].parsed.updates):
        np.testing.assert_array_equal(upd.state["w"],
                                      scaled_round(boosted_scales).updates[i].state["w"])


def test_value_cap_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="value_cap_mode='exact' is not one of"):
        Guards(value_cap_mode="exact")
    with pytest.raises(ValueError, match="set value_cap_multiple > 0"):
        Guards(value_cap_multiple=0.0, value_cap_mode="exactly")


def test_without_a_norm_cap_the_value_cap_has_no_reference_and_values_as_averaged() -> None:
    # Execute: the default value cap (1 x the reference, exactly) and none at all, both
    # without a norm cap
    def uncapped(**guards: Any) -> Any:
        return aggregate_round(
            scaled_round([0.4, 1.0, 1.1, 5.0]), {"w": np.zeros(4)}, selected=["c0", "c1"],
            valuation=ValuationSettings(method="exact", game="delta"), guards=Guards(**guards),
            norm_cap=resolve_auto("exact", norm_cap=Guards(**guards).norm_cap).norm_cap,
            utility_factory=delta_game, rng=np.random.default_rng(0), server_round=1)
    default, off = uncapped(norm_cap="none"), uncapped(norm_cap="none", value_cap_multiple=0.0,
                                                       value_cap_mode="at-most")
    # Assert: nothing was valued at a cap; the same phi as with the value cap off
    assert "value_cap" not in default.record and "norm_cap" not in default.record
    np.testing.assert_array_equal(default.valuation.phi, off.valuation.phi)
    assert resolve_auto("none", norm_cap="auto").norm_cap == "none"
    with pytest.raises(ValueError, match="value_cap_multiple=-1"):
        Guards(value_cap_multiple=-1)


def test_with_the_defaults_a_boosted_update_pointing_away_gets_at_most_an_honest_weight() -> None:
    # Prepare: eight honest clients step halfway to TARGET (each with a twist of its own); two
    # attackers share a direction of their own (orthogonal to TARGET: a backdoor's pull that
    # the clean game does not reward) and send it boosted 10 x
    away = np.array([2.0, 1.0, 0.0, 0.0])  # away @ TARGET == 0
    twists = np.random.default_rng(1).normal(0.0, 0.6, (8, 4))
    honest = [ClientUpdate(100 + i, f"c{i}", {"w": 0.5 * TARGET + twists[i]}, 10, 1.0)
              for i in range(8)]
    attackers = [ClientUpdate(108 + j, f"c{8 + j}",
                              {"w": 10.0 * (away + 0.05 * np.eye(4)[j])}, 10, 1.0)
                 for j in range(2)]
    parsed = ParsedReplies(updates=[*honest, *attackers])
    # Execute: the app's defaults (owen-antithetic M = 4, delta game, softmax weights, the
    # median norm cap, the value cap exactly at the reference, the link threshold)
    out = aggregate_round(parsed, {"w": np.zeros(4)},
                          selected=[u.client_id for u in parsed.updates],
                          valuation=ValuationSettings(), guards=Guards(),
                          norm_cap=Guards().norm_cap, utility_factory=delta_game,
                          rng=np.random.default_rng(0), server_round=2)
    # Assert: the attackers' shared direction links them into one player (no honest pair is
    # that close: as on real rounds at alpha 0.1), both were cut to the norm cap, and each
    # weighs no more than any honest client
    assert out.links == [["c8", "c9"]]
    weights = dict(zip([u.client_id for u in out.parsed.updates], out.valuation.weights,
                       strict=True))
    assert {"c8", "c9"} <= set(out.record["capped"])
    assert max(weights["c8"], weights["c9"]) <= min(weights[f"c{i}"] for i in range(8))
