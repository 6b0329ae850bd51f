"""Robustness of the confirmations' decisions (studies.confirmation.robustness, issue 60): each
seed left out in turn, reported beside the decision; and how many seeds an exact rank test needs
under Holm."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from scipy import stats

from sim.stats import paired_test, seeds_for_holm, smallest_exact_p
from studies.confirmation.protocol import CONFIRMATION_SEEDS

#: FedOwen minus equal-weight FedAvg per seed 100-107: p (t) 0.022 with all eight; without
#: seed 103 (0.9) it is 0.054, without any other seed below 0.05 (computed by hand below).
DIFFS = (0.3, 0.6, 0.0, 0.9, 0.2, 0.5, 0.1, 1.5)
#: Every other arm far below FedOwen (a shared offset, a small wobble): no seed matters.
GAPS = {"fedavgm": 10.0, "fedprox": 11.0, "fltrust": 12.0, "fedavg-samples": 9.0,
        "fedowen-random": 8.0}


def write_rounds(path: Path) -> None:
    """A first-study rounds CSV of one setting whose equal-weight FedAvg rests on seed 103."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["variant", "column", "seed", "round",
                                                "test_accuracy"])
        writer.writeheader()
        for i, seed in enumerate(CONFIRMATION_SEEDS):
            ours = 80.0 + (i % 3)
            levels = {"fedowen": ours, "fedavg-equal": ours - DIFFS[i],
                      **{arm: ours - gap - 0.1 * ((i * 5) % 3) for arm, gap in GAPS.items()}}
            for arm, level in levels.items():
                for rnd in range(96, 101):
                    writer.writerow({"variant": arm, "column": "alpha=0.1", "seed": seed,
                                     "round": rnd, "test_accuracy": round(level, 2)})


def test_a_seed_that_flips_a_decision_is_named_in_the_robustness_column(
        tmp_path: Path) -> None:
    # Prepare: the t-test's p by hand, with all seeds and without each one
    from studies.confirmation.pages import write_confirmation

    assert stats.ttest_1samp(DIFFS, 0).pvalue < 0.05
    without = {seed: stats.ttest_1samp([d for j, d in enumerate(DIFFS) if j != i], 0).pvalue
               for i, seed in enumerate(CONFIRMATION_SEEDS)}
    assert [s for s, p in without.items() if p >= 0.05] == [103]
    results = tmp_path / "results"
    write_rounds(results / "confirm-mnist" / "confirm-rounds.csv")
    # Execute
    write_confirmation(results, tmp_path / "confirmation.md", tmp_path / "h.csv")
    # Assert: confirmed with eight seeds, and the column says it falls without seed 103
    text = (tmp_path / "confirmation.md").read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| mnist | alpha=0.1 | "
                                                                "fedavg-equal |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-2:] == ["confirmed", "**7 of 8**: not confirmed without 103"]
    fltrust = next(ln for ln in text.splitlines() if "| fltrust |" in ln)
    assert fltrust.endswith("| confirmed | holds (8 of 8) |")
    assert "| p (Wilcoxon) | p (sign) | p (Holm) | decision | without one seed |" in text
    with (tmp_path / "h.csv").open() as fh:
        rows = {r["against"]: r for r in csv.DictReader(fh)}
    assert rows["fedavg-equal"]["holds_without_one_seed"] == "7"
    assert rows["fedavg-equal"]["flips_without"] == "103:not confirmed"
    assert rows["fltrust"]["holds_without_one_seed"] == "8"
    # the exact sign test: seven positive differences of seven non-zero ones
    assert float(rows["fedavg-equal"]["p_sign"]) == pytest.approx(2 / 2**7, abs=1e-4)


def test_an_exact_rank_test_needs_eleven_seeds_to_pass_holm_at_32_primaries() -> None:
    # 2 / 2^8 = 0.0078 > 0.05 / 32; 2 / 2^11 = 0.00098 < 0.0016 and 2 / 2^10 = 0.00195 is not
    assert smallest_exact_p(8) == pytest.approx(0.0078125)
    assert seeds_for_holm(32) == 11
    assert seeds_for_holm(24) == 10  # the first confirmation's 3 x 8 primaries
    assert seeds_for_holm(1) == 6  # 2 / 2^5 = 0.0625 is not below 0.05
    # scipy's exact tests reach that floor when every difference has one sign
    same_sign = {s: 1.0 + s / 10 for s in range(8)}
    test = paired_test(same_sign, dict.fromkeys(range(8), 0.0))
    assert test.p_wilcoxon == pytest.approx(smallest_exact_p(8))
    assert test.p_sign == pytest.approx(smallest_exact_p(8))
