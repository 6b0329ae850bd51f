"""The backdoor development rule (studies.backdoor.attack_success.verdict) on hand-built cell
rows."""

from __future__ import annotations

import math
from typing import Any

from studies.backdoor.attack_success import verdict


def rows(arm: str, asr: list[float], clean_val: list[float]) -> list[dict[str, Any]]:
    """An arm's attacked and clean cells on two datasets, seeds 0-2."""
    out = []
    for ds in ("mnist", "fashion-mnist"):
        for seed, (a, v) in enumerate(zip(asr, clean_val, strict=True)):
            out.append({"dataset": ds, "arm": arm, "seed": seed, "attack": "backdoor 20%",
                        "asr": a, "val": v - 1, "test": v - 1})
            out.append({"dataset": ds, "arm": arm, "seed": seed, "attack": "none",
                        "asr": math.nan, "val": v, "test": v})
    return out


def test_the_candidate_below_5_percent_within_2_points_goes_on() -> None:
    table = (rows("fedowen", [99.0, 98.0, 97.0], [90.0, 91.0, 92.0])
             + rows("fedowen-a", [1.0, 2.0, 4.9], [89.9, 90.8, 92.1])   # holds
             + rows("fedowen-b", [1.0, 2.0, 3.0], [85.0, 84.0, 86.0])   # costs 6 points
             + rows("fedowen-c", [1.0, 6.0, 3.0], [90.0, 91.0, 92.0]))  # one seed at 6%
    adopted, failures = verdict(table, "fedowen")
    assert adopted == "fedowen-a" and failures["fedowen-a"] == []
    assert any("clean cost" in f for f in failures["fedowen-b"])
    assert failures["fedowen-c"][0].startswith("fashion-mnist ASR above 5%: seed 1 6.0%")
    assert "fedowen" not in failures


def test_no_candidate_holding_means_none_goes_on() -> None:
    table = rows("fedowen", [99.0] * 3, [90.0] * 3) + rows("fedowen-x", [50.0] * 3, [90.0] * 3)
    assert verdict(table, "fedowen")[0] is None
