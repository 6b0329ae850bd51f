"""The confirmations' hypotheses (issues 28 and 46): who FedOwen is compared with, and how.

A :class:`Study` is one pre-registered confirmation: its seeds, its primary and secondary
hypotheses (:class:`Against`: one arm, or one of a group by the protocol's rule) and its
presets' prefix. :func:`read_endpoints` reads each arm's endpoint per seed from a committed
per-round CSV; :func:`compare` tests every hypothesis (paired t and Wilcoxon over the seeds,
Holm within each family) into :class:`Comparison` rows with their decision; :func:`verdict`
is one dataset's. The page that shows them is :mod:`studies.confirmation.pages`'s.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sim.compact import open_csv
from sim.stats import PairedTest, holm, paired_test
from studies.confirmation.protocol import (
    CONFIRMATION_SEEDS,
    PRESET_PREFIX,
    SECOND_CONFIRMATION_SEEDS,
    SECOND_PRESET_PREFIX,
)

#: The arm every hypothesis is about.
REFERENCE = "fedowen"
#: Primary hypotheses, per dataset x setting: FedOwen beats each; a tuple is "the better of"
#: (the one with the higher mean endpoint on the confirmation seeds: the harder comparison).
PRIMARY: tuple[tuple[str, ...], ...] = (("fedavg-equal",), ("fedavgm", "fedprox"), ("fltrust",))
SECONDARY: tuple[tuple[str, ...], ...] = (("fedavg-samples",), ("fedowen-random",))
#: The primary endpoint: test accuracy (%) averaged over these rounds.
ENDPOINT_ROUNDS = tuple(range(96, 101))
LEVEL = 0.05
HYPOTHESIS_FIELDS = ("family", "dataset", "setting", "against", "n", "mean_diff", "ci_lo",
                     "ci_hi", "p_t", "p_wilcoxon", "p_sign", "p_holm", "decision",
                     "holds_without_one_seed", "flips_without")
#: ``{dataset: {(arm, setting): {seed: endpoint}}}``, as :func:`read_endpoints` gives each.
Endpoints = dict[str, dict[tuple[str, str], dict[int, float]]]


@dataclass(frozen=True)
class Against:
    """Whom FedOwen is compared with in one hypothesis: one arm, or one of a group chosen by
    ``rule``: ``better``, the one of the higher mean endpoint on the scored seeds (the first
    confirmation's rule); ``picked``, the one the protocol picked on validation before any
    scored seed ran (``picks.json``); ``other``, the one it did not pick."""

    arms: tuple[str, ...]
    rule: str = "better"

    @property
    def key(self) -> str:
        return "+".join(self.arms)


@dataclass(frozen=True)
class Study:
    """One pre-registered confirmation: its presets and reports (``<prefix><dataset>``), its
    folder of protocol files (``docs/<folder>/``: PROTOCOL.md, arms.json, deviations.md,
    hypotheses.csv, and picks.json: ``{dataset: {setting: {group key: arm}}}``), its page
    (``docs/<folder>.md``), seeds, hypotheses and the per-dataset table's column names."""

    prefix: str
    folder: str
    title: str
    seeds: tuple[int, ...]
    primary: tuple[Against, ...]
    secondary: tuple[Against, ...]
    columns: tuple[str, ...]

    def arms(self) -> list[str]:
        """Every arm of the hypotheses, FedOwen first, each once."""
        named = [REFERENCE, *(a for h in (*self.primary, *self.secondary) for a in h.arms)]
        return list(dict.fromkeys(named))


#: The second confirmation's field selectors: the better one (picked on validation) is primary.
SELECTORS = ("power-of-choice", "oort")
FIRST = Study(PRESET_PREFIX, "confirmation", "The pre-registered confirmation",
              CONFIRMATION_SEEDS, tuple(Against(g) for g in PRIMARY),
              tuple(Against(g) for g in SECONDARY),
              ("vs equal-weight FedAvg", "vs tuned FedAvgM / FedProx", "vs FLTrust"))
SECOND = Study(SECOND_PRESET_PREFIX, "confirmation2", "The second pre-registered confirmation",
               SECOND_CONFIRMATION_SEEDS,
               (Against(("fedavg-equal",)), Against(("fedavg-tuned",)), Against(("fltrust",)),
                Against(SELECTORS, "picked")),
               (Against(SELECTORS, "other"), Against(("fedowen-random",))),
               ("vs equal-weight FedAvg", "vs tuned FedAvgM / FedProx", "vs FLTrust",
                "vs the better selector"))
STUDIES = {"first": FIRST, "second": SECOND}


@dataclass(frozen=True)
class Comparison:
    """One hypothesis ``FedOwen > against`` at one dataset and setting, tested."""

    family: str
    dataset: str
    setting: str
    against: str
    test: PairedTest
    p_holm: float = math.nan

    @property
    def decision(self) -> str:
        """``confirmed`` / ``reversed`` (Holm-adjusted two-sided paired t below the level, by
        the sign of the mean difference) / ``not confirmed``; ``pending`` without a test."""
        if math.isnan(self.p_holm):
            return "pending"
        if self.p_holm >= LEVEL:
            return "not confirmed"
        return "confirmed" if self.test.diff.mean > 0 else "reversed"


def read_endpoints(rounds_csv: Path) -> dict[tuple[str, str], dict[int, float]]:
    """``{(arm, setting): {seed: endpoint}}`` from an ablation report's ``<grid>-rounds.csv.gz``
    (or a plain ``.csv``); a seed counts once it has every round of :data:`ENDPOINT_ROUNDS`."""
    by_cell: dict[tuple[str, str, int], dict[int, float]] = {}
    with open_csv(rounds_csv) as fh:
        for row in csv.DictReader(fh):
            if row["test_accuracy"] != "" and int(row["round"]) in ENDPOINT_ROUNDS:
                key = (row["variant"], row["column"], int(row["seed"]))
                by_cell.setdefault(key, {})[int(row["round"])] = float(row["test_accuracy"])
    out: dict[tuple[str, str], dict[int, float]] = {}
    for (arm, setting, seed), accs in sorted(by_cell.items()):
        if set(accs) == set(ENDPOINT_ROUNDS):
            out.setdefault((arm, setting), {})[seed] = sum(accs.values()) / len(accs)
    return out


def compare(endpoints: Endpoints, study: Study | None = None, picks: dict[str, Any] | None = None
            ) -> list[Comparison]:
    """Every hypothesis of every dataset (``{dataset: read_endpoints(...)}``), Holm-adjusted
    within its family (all primaries together; all secondaries together)."""
    study = study or FIRST
    found: list[Comparison] = []
    for family, hypotheses in (("primary", study.primary), ("secondary", study.secondary)):
        tested = []
        for dataset, table in endpoints.items():
            settings = sorted({s for (arm, s) in table if arm == REFERENCE})
            for setting in settings:
                ours = table[(REFERENCE, setting)]
                for hypothesis in hypotheses:
                    against = _against(hypothesis, table, setting,
                                       (picks or {}).get(dataset, {}).get(setting, {}),
                                       f"{dataset} {setting}")
                    test = paired_test(ours, table.get((against, setting), {}))
                    tested.append(Comparison(family, dataset, setting, against, test))
        adjusted = holm([c.test.p_t for c in tested])
        found += [replace(c, p_holm=p) for c, p in zip(tested, adjusted, strict=True)]
    return found


def _against(hypothesis: Against, table: dict[tuple[str, str], dict[int, float]],
             setting: str, picks: dict[str, str], where: str) -> str:
    """The arm a hypothesis compares FedOwen with at one setting (:class:`Against`)."""
    arms = hypothesis.arms
    if len(arms) == 1:
        return arms[0]
    if hypothesis.rule == "better":
        return max(arms, key=lambda a: _mean(table.get((a, setting), {})))
    chosen = picks.get(hypothesis.key)
    if chosen not in arms:
        raise ValueError(f"{where}: no pick among {list(arms)} for {hypothesis.key!r} in the "
                         f"protocol's picks.json (got {chosen!r}): write the pick made on the "
                         "validation split there before the report is read")
    return chosen if hypothesis.rule == "picked" else next(a for a in arms if a != chosen)


def _mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values) if values else -math.inf


def hypothesis_rows(comparisons: list[Comparison]) -> list[dict[str, Any]]:
    """The comparisons as CSV rows (4 decimals: the report's own precision); the robustness
    fields are :mod:`studies.confirmation.robustness`'s."""
    def num(x: float) -> str:
        return "" if math.isnan(x) else f"{x:.4f}"

    return [{"family": c.family, "dataset": c.dataset, "setting": c.setting,
             "against": c.against, "n": c.test.diff.n, "mean_diff": num(c.test.diff.mean),
             "ci_lo": num(c.test.diff.lo), "ci_hi": num(c.test.diff.hi), "p_t": num(c.test.p_t),
             "p_wilcoxon": num(c.test.p_wilcoxon), "p_sign": num(c.test.p_sign),
             "p_holm": num(c.p_holm), "decision": c.decision} for c in comparisons]


def verdict(decisions: list[str]) -> str:
    """One dataset's verdict from its primary decisions (PROTOCOL.md section 6): *confirmed*
    only when every one is, *reversed* when any is, else *partly* or *not confirmed*."""
    confirmed = decisions.count("confirmed")
    if "reversed" in decisions:
        return f"reversed ({confirmed} of {len(decisions)} primaries confirmed)"
    if decisions and confirmed == len(decisions):
        return "confirmed"
    return "partly confirmed" if confirmed else "not confirmed"
