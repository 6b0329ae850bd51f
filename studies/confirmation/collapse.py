"""When a run counts as collapsed: below 20%, or no better than always answering the majority
class of the split it is scored on (issue 60).

Below 20% was the arena's rule; it cannot fire on a binary dataset whose majority class is
73%: BreastMNIST's FLTrust scores exactly its test split's majority rate in every seed of the
second confirmation. The majority rates are of the datasets' own splits (the test split; the
validation split at the presets' fractions), stored here so that the pages regenerate from
committed files alone; ``tests/test_collapse.py`` measures them again where the data is.
"""

from __future__ import annotations

import math

#: An endpoint below this (%) collapsed whatever the dataset (the arena's rule).
COLLAPSE_BELOW = 20.0
#: The majority class's share (%) of each split, 2 decimals (the per-round CSVs' precision).
#: ``test``: the official test split (BreastMNIST: 114 of 156). ``validation``: the tuning's
#: validation set, stratified from the training split at the presets' fractions (evaluation
#: 10% and validation 10% for BreastMNIST, 1% and 5% elsewhere; the same for every seed;
#: BreastMNIST: 36 of 49).
MAJORITY_PERCENT: dict[str, dict[str, float]] = {
    "test": {"mnist": 11.35, "fashion-mnist": 10.00, "cifar10": 10.00, "femnist": 8.05,
             "breastmnist": 73.08},
    "validation": {"mnist": 11.25, "fashion-mnist": 10.00, "cifar10": 10.00, "femnist": 7.68,
                   "breastmnist": 73.47},
}
#: The app's names for a dataset that the reports name otherwise.
ALIASES = {"medmnist": "breastmnist", "medmnist:breastmnist": "breastmnist"}
#: Half the CSVs' last digit: a score equal to the rate after rounding is at it.
_ROUNDING = 0.005


def majority_rate(dataset: str, split: str = "test") -> float:
    """The majority class's share (%) of ``dataset``'s ``split``; NaN where it is not known
    (then only :data:`COLLAPSE_BELOW` marks a collapse)."""
    return MAJORITY_PERCENT[split].get(ALIASES.get(dataset, dataset), math.nan)


def collapsed(value: float, dataset: str, split: str = "test") -> bool:
    """Whether a score (%) is below 20% or at or below the split's majority-class rate."""
    rate = majority_rate(dataset, split)
    return value < COLLAPSE_BELOW or (not math.isnan(rate) and value <= rate + _ROUNDING)


def floor_text(datasets: list[str], split: str = "test") -> str:
    """``below 20%, or at or below the majority class's rate where that is higher
    (breastmnist 73.08%)``: the rule as a page states it for the datasets it shows."""
    high = {ALIASES.get(d, d): majority_rate(d, split) for d in datasets}
    named = ", ".join(f"{d} {r:.2f}%" for d, r in sorted(high.items())
                      if not math.isnan(r) and r >= COLLAPSE_BELOW)
    return (f"below {COLLAPSE_BELOW:.0f}%, or at or below the {split} split's majority-class "
            "rate (always answering the most frequent class)"
            + (f": {named}" if named else ""))
