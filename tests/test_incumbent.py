"""The challenger-against-incumbent table (studies.selection.incumbent) on a hand-built example:
two settings, three seeds, every number worked out by hand (t quantiles from a table:
t(0.975; 1) = 12.706205, t(0.975; 2) = 4.302653, t(0.975; 5) = 2.570582)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from studies.selection.cells import write_csv
from studies.selection.incumbent import paired_rows

# Differences: setting A 1, 3, 5; setting B -1, -1, 2; seed means 0, 1, 3.5.
CHALLENGER = {"A": {0: 3.0, 1: 5.0, 2: 7.0}, "B": {0: 1.0, 1: 1.0, 2: 4.0}}
INCUMBENT = {"A": {0: 2.0, 1: 2.0, 2: 2.0}, "B": {0: 2.0, 1: 2.0, 2: 2.0}}


def by_label(rows: list[dict]) -> dict[str, dict]:
    return {r["comparison"]: r for r in rows}


def test_each_row_by_hand() -> None:
    # Prepare: (pairs, mean, half-width, p, favouring) per row. A: sd 2, half 4.302653 * 2 /
    # sqrt 3, t = 3 / (2 / sqrt 3) = 2.598076 and with 2 degrees of freedom p = 1 - t /
    # sqrt(t^2 + 2). B: mean 0, sd sqrt 3, p 1. All six pairs: mean 1.5, sd sqrt 5.5. Seed
    # means 0, 1, 3.5: mean 1.5, sd sqrt 3.25, seed 0 (exactly 0) favours neither. Without seed
    # 0: 1, 3.5 (sd 1.767767, t = 1.8, p = 1 - 2 atan(t) / pi with 1 degree of freedom);
    # without seed 2: 0, 1 (t = 1, p = 0.5). Without A the seed means are B's differences.
    expected = {
        "A": (3, 3.0, 4.302653 * 2 / math.sqrt(3), 1 - 2.598076 / math.sqrt(8.75), 3),
        "B": (3, 0.0, 4.302653, 1.0, 1),
        "all (setting-seed pairs)": (6, 1.5, 2.570582 * math.sqrt(5.5 / 6), None, 4),
        "all (seed means)": (3, 1.5, 4.302653 * math.sqrt(3.25 / 3), None, 2),
        "all (seed means) without seed 0": (2, 2.25, 12.706205 * 1.25,
                                            1 - 2 * math.atan(1.8) / math.pi, 2),
        "all (seed means) without seed 1": (2, 1.75, 12.706205 * 1.75, 0.5, 1),
        "all (seed means) without seed 2": (2, 0.5, 12.706205 * 0.5, 0.5, 1),
        "all (seed means) without A": (3, 0.0, 4.302653, 1.0, 1),
        "all (seed means) without B": (3, 3.0, 4.302653 * 2 / math.sqrt(3), None, 3),
    }

    # Execute
    rows = by_label(paired_rows(CHALLENGER, INCUMBENT))

    # Assert
    assert list(rows) == list(expected)
    for label, (pairs, mean, half, p, favouring) in expected.items():
        r = rows[label]
        assert r["pairs"] == pairs, label
        assert r["mean_diff"] == pytest.approx(mean, abs=1e-6), label
        assert r["ci_low"] == pytest.approx(mean - half, abs=1e-5), label
        assert r["ci_high"] == pytest.approx(mean + half, abs=1e-5), label
        if p is not None:
            assert r["p_t"] == pytest.approx(p, abs=1e-6), label
        assert r["favouring"] == favouring, label


def test_the_csv_holds_the_rows_to_four_decimals(tmp_path: Path) -> None:
    # Prepare
    path = tmp_path / "table.csv"

    # Execute
    write_csv(path, paired_rows(CHALLENGER, INCUMBENT))
    with path.open() as fh:
        lines = list(csv.DictReader(fh))

    # Assert: A's line as worked out above (half-width 4.968275, p 0.121690)
    assert list(lines[0]) == ["comparison", "pairs", "mean_diff", "ci_low", "ci_high", "p_t",
                              "favouring"]
    assert lines[0] == {"comparison": "A", "pairs": "3", "mean_diff": "3.0000",
                        "ci_low": "-1.9683", "ci_high": "7.9683", "p_t": "0.1217",
                        "favouring": "3"}
    assert lines[1]["p_t"] == "1.0000" and lines[1]["favouring"] == "1"


def test_a_seed_missing_in_one_setting_leaves_the_seed_means() -> None:
    # Prepare: seed 2 of B not finished
    challenger = {"A": CHALLENGER["A"], "B": {0: 1.0, 1: 1.0}}
    incumbent = {"A": INCUMBENT["A"], "B": {0: 2.0, 1: 2.0}}

    # Execute
    rows = by_label(paired_rows(challenger, incumbent))

    # Assert: B has two pairs, all pairs five, the seed means only seeds 0 and 1 (0, 1)
    assert rows["B"]["pairs"] == 2
    assert rows["all (setting-seed pairs)"]["pairs"] == 5
    assert rows["all (seed means)"]["pairs"] == 2
    assert rows["all (seed means)"]["mean_diff"] == pytest.approx(0.5)
    assert "all (seed means) without seed 2" not in rows
