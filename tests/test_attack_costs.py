"""Attack costs: each attacked cell paired with the clean cell of the same defence and seed."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sim.grid import Cell
from sim.results import CellResult
from studies.adversarial.attack_costs import markdown, seed_agreement, seed_rows, summarise

ROUNDS = 12


def cell(cid: str, seed: int, kind: str | None, accs: list[float],
         weights: dict[str, float] | None = None) -> CellResult:
    cfg: dict[str, Any] = {"dataset": "mnist", "alpha": 0.1, "seed": seed,
                           "num-server-rounds": ROUNDS, "valuation": "owen"}
    if kind:
        cfg.update({"adversary-kind": kind, "adversary-fraction": 0.2})
    else:
        cfg["adversary-fraction"] = 0.0
    rounds = [{"round": 0, "test_accuracy": 0.1}]
    rounds += [{"round": r + 1, "test_accuracy": a / 100, "weights": weights or {}}
               for r, a in enumerate(accs)]
    return CellResult(Cell(cid, "g", cfg, {"variant": "fedowen-new"}), rounds)


def test_losses_pair_by_seed_and_collapse_is_any_of_the_last_ten_rounds() -> None:
    # Prepare: two seeds; the attack costs 1 point on seed 0 and 3 on seed 1; seed 1 dipped
    # below 20% once in the last 10 rounds. Seed 5's attacked cell has no clean pair.
    clean0 = cell("c0", 0, None, [90.0] * ROUNDS)
    clean1 = cell("c1", 1, None, [80.0] * ROUNDS)
    att0 = cell("a0", 0, "alie", [89.0] * ROUNDS, {"3": 0.05, "7": 0.1, "8": 0.15})
    accs1 = [77.0] * ROUNDS
    accs1[4] = 15.0  # round 5: inside the last 10 of 12, outside the last 5
    att1 = cell("a1", 1, "alie", accs1, {"3": 0.1, "7": 0.1})
    orphan = cell("a5", 5, "alie", [50.0] * ROUNDS)
    res = {r.cell.cell_id: r for r in (clean0, clean1, att0, att1, orphan)}
    variant_of = {cid: "fedowen-new" for cid in res}
    # Execute: partitions 0-9 at fraction 0.2 and seed s: whoever adversary_ids names
    rows = seed_rows(res, 10, variant_of)
    summary = summarise(rows)
    # Assert
    assert [r["cell"] for r in rows] == ["a0", "a1"]
    assert [r["loss"] for r in rows] == pytest.approx([1.0, 3.0])
    assert [r["collapsed"] for r in rows] == [False, True]
    (s,) = summary
    assert s["loss"].mean == pytest.approx(2.0) and s["n"] == 2 and s["collapsed"] == 1
    # t(0.975, 1) = 12.706; sd of (1, 3) = sqrt(2); half = 12.706 * sqrt(2) / sqrt(2)
    assert s["loss"].half == pytest.approx(12.706, rel=1e-3)
    assert not s["held"]  # the upper bound is far above 2 points
    assert "alie 20%" in markdown(summary)


def test_weight_ratio_is_per_reply_attacker_over_honest() -> None:
    from fedowen_task.adversary.keys import adversary_ids

    adv = sorted(adversary_ids(10, 0.2, 0))
    honest = [i for i in range(10) if i not in adv][:2]
    weights = {str(adv[0]): 0.1, str(honest[0]): 0.2, str(honest[1]): 0.4}
    res = {"c0": cell("c0", 0, None, [90.0] * ROUNDS),
           "a0": cell("a0", 0, "ipm", [90.0] * ROUNDS, weights)}
    (row,) = seed_rows(res, 10, {})
    assert row["weight_ratio"] == pytest.approx(0.1 / 0.3)
    assert math.isnan(row["payout_ratio"])  # no phi recorded: no ledger


def test_fresh_and_development_seeds_agree_only_on_all_three_verdicts() -> None:
    def rows(attack: str, losses: list[float], payouts: list[float]) -> list[dict[str, Any]]:
        return [{"setting": "mnist", "attack": attack, "defence": "d", "seed": i, "loss": x,
                 "collapsed": False, "weight_ratio": 1.0, "payout_ratio": pay}
                for i, (x, pay) in enumerate(zip(losses, payouts, strict=True))]

    development = [*rows("boost", [0.1, 0.2, 0.0], [0.5, 0.9, 0.2]),
                   *rows("sybil", [0.1, 0.2, 0.0], [0.5, 0.9, 0.2]),
                   *rows("flip", [0.1, 0.2, 0.0], [0.1, 0.1, 0.1])]
    fresh = [*rows("boost", [0.0, 0.3, 0.1], [0.4, 0.8, 0.3]),   # same reading
             *rows("sybil", [0.0, 0.3, 0.1], [0.4, 1.8, 0.3]),   # one seed overpaid
             *rows("flip", [9.0, 12.0, 10.0], [0.1, 0.1, 0.1]),  # not held
             *rows("ipm", [0.0, 0.1, 0.2], [0.0, 0.0, 0.0])]     # no development reading
    table = seed_agreement(fresh, development)
    agree = {line.split(" | ")[1]: line.split(" | ")[-1] for line in table.splitlines()[2:]}
    assert agree == {"boost": "yes |", "sybil": "**no** |", "flip": "**no** |"}
    assert "1.80" in table and "ipm" not in table
    # another defence on the same seeds: the columns say so
    header = seed_agreement(fresh, development, ("old, same seeds", "new")).splitlines()[0]
    assert header.startswith("| setting | attack | old, same seeds: loss")
    assert "| new: loss" in header


def test_an_attacker_paid_above_honest_is_read_against_what_its_data_earns_clean() -> None:
    # Prepare: seed 0's two adversaries (10 partitions, 20%). Seed "rich": they earn 3 a round
    # honest clients 1, in the clean run as in the attacked one (their data is worth it).
    # Seed "boost": clean they earn 1 like everyone, attacked 3 (the attack pays).
    from fedowen_task.adversary.keys import adversary_ids

    adv = sorted(str(i) for i in adversary_ids(10, 0.2, 0))
    others = [str(i) for i in range(10) if str(i) not in adv]

    def run(cid: str, kind: str | None, adv_phi: float) -> CellResult:
        r = cell(cid, 0, kind, [90.0] * ROUNDS)
        phi = {**{c: adv_phi for c in adv}, **{c: 1.0 for c in others}}
        for rec in r.rounds[1:]:
            rec.update(selected=list(phi), phi=phi)
        return r

    for clean_phi, attacked_phi, paid in ((3.0, 3.0, 0), (1.0, 3.0, 1)):
        res = {"c": run("c", None, clean_phi), "a": run("a", "boosted", attacked_phi)}
        # Execute
        (row,) = seed_rows(res, 10, {})
        (s,) = summarise([row])
        # Assert: both are paid 3x an honest client; only the second is paid for the attack
        assert row["payout_ratio"] == pytest.approx(3.0)
        assert row["clean_payout_ratio"] == pytest.approx(clean_phi)
        assert (s["overpaid"], s["attack_paid"]) == (1, paid)
        assert f"| 1 ({paid}) |" in markdown([s])
