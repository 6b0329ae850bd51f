"""backdoor-defaults-dev's rule (studies.backdoor.defaults_rule) on hand-built cell rows, and
how it scores a stalled cell."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sim.presets import load_preset
from sim.results import CellResult
from studies.backdoor.defaults_rule import (
    attack_of,
    cell_row,
    decide,
    defence_count,
    ranking,
    read,
    report,
    scored_rounds,
)

SETTINGS = (("mnist", 0.1), ("cifar10", 0.1))
ATTACKS = ("square", "dba")
ARMS = ["fedowen", "a", "a+b", "c"]


def rows(arm: str, asr: float, clean: list[float], payout: float = 0.5,
         worse: tuple[tuple[str, float], str, float] | None = None) -> list[dict[str, Any]]:
    """An arm's cells: attacked (seeds 0-2) at ``asr`` everywhere (``worse``: one (setting,
    attack) pair at another ASR) and clean (seeds 0-4) at validation ``clean``."""
    out = []
    for ds, alpha in SETTINGS:
        for attack in ATTACKS:
            for seed in range(3):
                hit = asr if worse is None or worse[:2] != ((ds, alpha), attack) else worse[2]
                out.append({"dataset": ds, "alpha": alpha, "arm": arm, "seed": seed,
                            "attack": attack, "asr": hit, "val": 0.0, "payout_ratio": payout})
        for seed, v in enumerate(clean):
            out.append({"dataset": ds, "alpha": alpha, "arm": arm, "seed": seed,
                        "attack": "clean", "asr": math.nan, "val": v, "payout_ratio": math.nan})
    return out


BASE = [90.0, 91.0, 92.0, 90.5, 91.5]


def shifted(by: float, jitter: float = 0.1) -> list[float]:
    return [v + by + (jitter if i % 2 else -jitter) for i, v in enumerate(BASE)]


def test_of_the_arms_that_hold_the_cheapest_is_picked() -> None:
    table = (rows("fedowen", 90.0, BASE) + rows("a", 3.0, shifted(-1.0))
             + rows("a+b", 1.0, shifted(-0.2)) + rows("c", 50.0, shifted(0.0)))
    chosen, readings = decide(table, ARMS, [0, 1, 2], [0, 1, 2, 3, 4])
    assert readings["a"].holds() and readings["a+b"].holds() and not readings["c"].holds()
    assert chosen == "a+b"  # -0.2 points beats -1.0, though it adds two defences


def test_step_3_orders_every_arm_that_holds_and_the_report_names_the_order() -> None:
    # Prepare: a+b cheapest, a next, c fails (ASR 50)
    table = (rows("fedowen", 90.0, BASE) + rows("a", 3.0, shifted(-1.0))
             + rows("a+b", 1.0, shifted(-0.2)) + rows("c", 50.0, shifted(0.0)))
    readings = {a: read(table, a, [0, 1, 2], [0, 1, 2, 3, 4]) for a in ARMS}
    # Execute
    order = ranking(readings, ARMS, {a: defence_count(a) for a in ARMS})
    text = report(table, ARMS, [0, 1, 2], [0, 1, 2, 3, 4], expected=len(table))
    # Assert: the pick first, then the arm stage 2 falls back to; c is in no order
    assert order == ["a+b", "a"]
    assert "**Pick: a+b** (step 3's order, which stage 2 falls back along: a+b, a)" in text


def test_stage_2_without_clean_cells_holds_an_arm_on_asr_and_payout_alone() -> None:
    # Prepare: stage 2's cells, attacked only: the pick holds every pair, or misses one
    attacked = [r for r in rows("fedowen", 90.0, BASE) + rows("a", 3.0, BASE)
                if r["attack"] != "clean"]
    missed = [r for r in rows("fedowen", 90.0, BASE)
              + rows("a", 3.0, BASE, worse=(("mnist", 0.1), "square", 7.0))
              if r["attack"] != "clean"]
    # Execute
    held, readings = decide(attacked, ["fedowen", "a"], [0, 1, 2], [])
    text = report(attacked, ["fedowen", "a"], [0, 1, 2], [], len(attacked), "stage-2")
    # Assert
    assert held == "a" and readings["a"].holds_attacks() and not readings["a"].cost_ok()
    assert text.startswith("# stage-2: the rule's reading") and "No clean cells" in text
    assert "| a | yes | 4 of 4 |" in text and "- without clean seed" not in text
    assert decide(missed, ["fedowen", "a"], [0, 1, 2], [])[0] is None


def test_the_report_names_attacked_cells_whose_model_the_attack_broke() -> None:
    # Prepare: arm a holds on ASR, but one attacked cell's model is at chance (ASR 0)
    table = rows("fedowen", 90.0, BASE) + rows("a", 3.0, shifted(-0.5))
    for r in table:
        r["val"] = r["val"] if r["attack"] == "clean" else 90.0
    broken = next(r for r in table if r["arm"] == "a" and r["attack"] == "dba")
    broken.update(val=9.8, asr=0.0)
    # Execute
    text = report(table, ["fedowen", "a"], [0, 1, 2], [0, 1, 2, 3, 4], expected=len(table))
    # Assert: named, with its clean reference; the rule's pick is not changed by it
    assert "under their arm's clean mean (reported, not deciding): 1:" in text
    assert "- a mnist a0.1 dba seed 0: 9.8 against 90.5 clean (ASR 0.0)" in text
    assert "**Pick: a**" in text


def test_a_tie_in_cost_goes_to_fewer_defences() -> None:
    table = (rows("fedowen", 90.0, BASE) + rows("a", 3.0, shifted(-0.52))
             + rows("a+b", 1.0, shifted(-0.48)))
    assert decide(table, ["fedowen", "a", "a+b"], [0, 1, 2], [0, 1, 2, 3, 4])[0] == "a"


def test_one_pair_above_5_percent_or_overpaid_attackers_or_a_wide_cost_fail() -> None:
    table = (rows("fedowen", 90.0, BASE)
             + rows("a", 3.0, shifted(-0.5), worse=(("cifar10", 0.1), "dba", 5.1))
             + rows("a+b", 3.0, shifted(-0.5), payout=1.2)
             + rows("c", 3.0, shifted(-1.5, jitter=2.0)))   # mean -1.5, interval below -2
    chosen, readings = decide(table, ARMS, [0, 1, 2], [0, 1, 2, 3, 4])
    assert not any(readings[a].holds() for a in ("a", "a+b", "c"))
    assert readings["a"].pairs_held() == 3 and readings["a+b"].pairs_held() == 0
    assert not readings["c"].cost_ok() and readings["a"].cost_ok()
    assert chosen == "a"  # none holds: the most pairs within the cost, more than fedowen's 0


def test_no_pick_when_nothing_beats_the_defaults_pairs() -> None:
    table = rows("fedowen", 4.0, BASE) + rows("a", 4.0, shifted(-0.5), payout=1.5)
    assert decide(table, ["fedowen", "a"], [0, 1, 2], [0, 1, 2, 3, 4])[0] is None


def test_the_report_names_the_pick_and_its_leave_one_out_readings() -> None:
    table = rows("fedowen", 90.0, BASE) + rows("a", 3.0, shifted(-0.5))
    text = report(table, ["fedowen", "a"], [0, 1, 2], [0, 1, 2, 3, 4], expected=len(table))
    assert "**Pick: a**" in text
    assert text.count("- without attacked seed") == 3 and text.count("- without clean seed") == 5
    assert "| mnist a0.1 | square | 90.0 / 0.50 | 3.0 / 0.50 |" in text


def test_grid_names_and_defence_counts() -> None:
    assert attack_of("neurotoxin-cifar10") == "neurotoxin" and attack_of("plus-lenet") == "plus"
    assert [defence_count(a) for a in ("fedowen", "alignins-2", "alignins-2+spread-2")] == [0, 1, 2]


@pytest.fixture(scope="module")
def cell():
    preset = load_preset("conf/backdoor-defaults-dev.toml")
    return preset.cells()[0]


def _round(k: int, accepted: bool) -> dict[str, Any]:
    return {"round": k, "returned": ["1"] if accepted else [],
            "rejected": {} if accepted else {"1": "norm", "2": "cosine"},
            "val_accuracy": 0.1 * k, "attack_success": 0.01 * k}


def test_a_stalled_cell_is_carried_to_the_end_and_a_broken_one_left_out(cell) -> None:
    total = cell.config.num_server_rounds
    stalled = [{"round": 0}] + [_round(1, True)] + [_round(k, False) for k in (2, 3, 4)]
    scored = scored_rounds(CellResult(cell, stalled))
    assert scored is not None and len(scored) == total + 1
    assert scored[-1]["round"] == total and scored[-1]["val_accuracy"] == pytest.approx(0.4)
    cut = [{"round": 0}] + [_round(k, True) for k in (1, 2, 3)]  # ended, but learning
    assert scored_rounds(CellResult(cell, cut)) is None


def test_an_arm_missing_a_pair_is_not_read_as_holding_it() -> None:
    full = rows("a+b", 3.0, shifted(-1.0))
    partial = [r for r in rows("a", 1.0, shifted(0.0))
               if not (r["dataset"] == "cifar10" and r["attack"] == "dba")]
    table = rows("fedowen", 90.0, BASE) + partial + full
    assert decide(table, ["fedowen", "a", "a+b"], [0, 1, 2], [0, 1, 2, 3, 4])[0] == "a+b"


def test_the_report_names_clean_pairs_run_on_cpus_of_other_kernels() -> None:
    # Prepare: every cell on one CPU but arm a's clean seed 3 on mnist (another CPU's kernels)
    table = rows("fedowen", 90.0, BASE) + rows("a", 3.0, shifted(-0.5))
    for r in table:
        other = (r["arm"], r["attack"], r["seed"], r["dataset"]) == ("a", "clean", 3, "mnist")
        r["kernels"] = "AVX2 [avx2 fma avx]" if other else "AVX512 [avx512f avx2 fma avx]"
    # Execute
    text = report(table, ["fedowen", "a"], [0, 1, 2], [0, 1, 2, 3, 4], expected=len(table))
    # Assert
    assert "AVX2 [avx2 fma avx]: 1; AVX512 [avx512f avx2 fma avx]: 43." in text
    assert "other kernel flags: 1 of 10 [('mnist', 0.1, 3, 'a')]." in text


def test_the_report_shows_each_settings_clean_cost_interval_and_the_reported_numbers() -> None:
    # Prepare: arm a costs 1 point (+-0.1 jitter) everywhere; its attackers weigh half an honest
    table = rows("fedowen", 90.0, BASE) + rows("a", 3.0, shifted(-1.0))
    for r in table:
        r.update(test=r["val"] - 1.0, seconds=2.0 if r["arm"] == "a" else 1.0,
                 honest_rejected=0.5 if r["arm"] == "a" else 0.0,
                 weight_ratio=0.5 if r["attack"] != "clean" else math.nan)
    # Execute
    text = report(table, ["fedowen", "a"], [0, 1, 2], [0, 1, 2, 3, 4], expected=len(table))
    # Assert: step 1's interval per setting (fedowen's column is its mean) ...
    assert "| mnist a0.1 | 91.00 | -1.02 [-1.16, -0.88] |" in text
    # ... and the reported row: test cost, weight ratio, rejections clean / attacked, seconds
    assert "| a | -1.02 | 0.50 | 0.50 / 0.50 | 2.00 |" in text
    assert "| fedowen | - | 0.50 | 0.00 / 0.00 | 1.00 |" in text


def test_a_cells_row_counts_honest_rejections_and_the_attackers_weight(cell) -> None:
    # Prepare: the cell's attackers (20% of 100) and two honest ids
    cfg = cell.config
    adv = sorted(cfg.adversary().client_ids(100), key=int)
    honest = [str(c) for c in range(100) if str(c) not in adv][:2]
    recs = [{"round": 0}] + [
        {"round": k, "returned": [adv[0], *honest], "rejected": {honest[0]: "norm", adv[1]: "x"},
         "weights": {adv[0]: 0.1, honest[1]: 0.3}, "val_accuracy": 0.9, "test_accuracy": 0.8,
         "attack_success": 0.02, "round_seconds": 1.5}
        for k in range(1, cfg.num_server_rounds + 1)]
    # Execute
    row = cell_row(CellResult(cell, recs), 100)
    # Assert
    assert row is not None and row["attack"] != "clean"
    assert row["honest_rejected"] == 1.0 and row["weight_ratio"] == pytest.approx(1 / 3)
    assert row["test"] == pytest.approx(80.0) and row["seconds"] == 1.5


def test_stage_2_of_a_fallback_pick_asks_more_pairs_than_the_defaults_not_every_pair() -> None:
    # Prepare: stage 2's cells; the pick misses one pair of four, fedowen holds none
    missed = [r for r in rows("fedowen", 90.0, BASE)
              + rows("a", 3.0, BASE, worse=(("mnist", 0.1), "square", 7.0))
              if r["attack"] != "clean"]
    arms = ["fedowen", "a"]
    # Execute
    strict = decide(missed, arms, [0, 1, 2], [])[0]
    again = decide(missed, arms, [0, 1, 2], [], fallback=True)[0]
    text = report(missed, arms, [0, 1, 2], [], len(missed), "stage-2", fallback=True)
    # Assert: a pick stage 1 made by step 2 fails; one it made by step 3's fallback passes
    assert strict is None and again == "a"
    assert "more pairs than fedowen (0)" in text and "**Pick: a**" in text
    everywhere = [r for r in rows("fedowen", 3.0, BASE) + rows("a", 7.0, BASE)
                  if r["attack"] != "clean"]  # fedowen holds all four, a none
    assert decide(everywhere, arms, [0, 1, 2], [], fallback=True)[0] is None


def test_the_fresh_seeds_of_the_defaults_alone_are_read_without_a_pick() -> None:
    # Prepare: one arm, no fedowen (conf/backdoor-defaults-fresh.toml's "adopted")
    table = rows("adopted", 3.0, BASE, worse=(("mnist", 0.1), "square", 40.0))
    # Execute
    text = report(table, ["adopted"], [0, 1, 2], [0, 1, 2, 3, 4], len(table), "fresh")
    # Assert: read on ASR and payout; no pick, no leave-one-out
    assert "No fedowen arm" in text and "| adopted | no | 3 of 4 |" in text
    assert "Pick" not in text and "- without" not in text
    assert "| mnist a0.1 | square | 40.0 / 0.50 |" in text
