"""How much a confirmation's decisions rest on one seed (issue 60): each seed left out in turn.

Reported beside the decisions, never deciding (the verdict rule is the protocol's). For every
seed of the study, :func:`seed_flips` drops that seed from every arm of every dataset, tests
every hypothesis again with Holm over the same family
(:func:`studies.confirmation.hypotheses.compare`) and notes where a decision changes;
:func:`robustness_text` is the page's cell. The note of :func:`nonparametric_note` says why no
exact rank test can pass the strictest Holm step with the study's seeds.
"""

from __future__ import annotations

from typing import Any

from sim.stats import seeds_for_holm, smallest_exact_p
from studies.confirmation.hypotheses import LEVEL, Comparison, Endpoints, Study, compare

#: A hypothesis's place: family, dataset, setting and its index among that setting's family.
Key = tuple[str, str, str, int]
SIGNIFICANT = ("confirmed", "reversed")


def keyed(comparisons: list[Comparison]) -> dict[Key, Comparison]:
    """The comparisons by :data:`Key` (an arm picked as "the better" may differ by seed)."""
    out: dict[Key, Comparison] = {}
    for c in comparisons:
        k = sum(1 for key in out if key[:3] == (c.family, c.dataset, c.setting))
        out[(c.family, c.dataset, c.setting, k)] = c
    return out


def without_seed(endpoints: Endpoints, seed: int) -> Endpoints:
    """The endpoints with ``seed`` left out of every arm of every dataset."""
    return {dataset: {cell: {s: v for s, v in by_seed.items() if s != seed}
                      for cell, by_seed in table.items()}
            for dataset, table in endpoints.items()}


def seed_flips(endpoints: Endpoints, study: Study, picks: dict[str, Any] | None = None
               ) -> dict[Key, list[tuple[int, str]]]:
    """Per hypothesis, the seeds whose omission changes its decision and what it becomes."""
    full = keyed(compare(endpoints, study, picks))
    seeds = sorted({s for table in endpoints.values() for v in table.values() for s in v})
    flips: dict[Key, list[tuple[int, str]]] = {key: [] for key in full}
    for seed in seeds:
        for key, c in keyed(compare(without_seed(endpoints, seed), study, picks)).items():
            if key in full and c.decision != full[key].decision:
                flips[key].append((seed, c.decision))
    return flips


def robustness_text(decision: str, flips: list[tuple[int, str]], seeds: int) -> str:
    """The page's cell for one decision: ``holds without any one seed``, or which seeds'
    omission turns it into what; ``-`` for a decision that is not significant."""
    if decision not in SIGNIFICANT:
        return "-"
    if not flips:
        return f"holds ({seeds} of {seeds})"
    by_result: dict[str, list[int]] = {}
    for seed, result in flips:
        by_result.setdefault(result, []).append(seed)
    said = "; ".join(f"{result} without {', '.join(map(str, s))}"
                     for result, s in sorted(by_result.items()))
    return f"**{seeds - len(flips)} of {seeds}**: {said}"


def robustness_fields(decision: str, flips: list[tuple[int, str]], seeds: int
                      ) -> dict[str, str]:
    """The hypotheses CSV's robustness columns: how many seeds' omission leaves a significant
    decision standing (empty when it is not significant) and ``seed:decision`` per flip."""
    if decision not in SIGNIFICANT:
        return {"holds_without_one_seed": "", "flips_without": ""}
    return {"holds_without_one_seed": str(seeds - len(flips)),
            "flips_without": " ".join(f"{seed}:{result}" for seed, result in flips)}


def nonparametric_note(primaries: int, seeds: int, level: float = LEVEL) -> str:
    """Why an exact rank test cannot pass the strictest Holm step at this study's size."""
    smallest, threshold = smallest_exact_p(seeds), level / primaries
    verb = "cannot" if smallest >= threshold else "can"
    return (f"With {seeds} seeds the smallest p an exact sign or Wilcoxon test can give is "
            f"2/2^{seeds} = {smallest:.4f}; Holm's strictest step among {primaries} primaries "
            f"is {level}/{primaries} = {threshold:.4f}, so a non-parametric test {verb} pass "
            f"it; {seeds_for_holm(primaries, level)} seeds, all of one sign, would be the "
            "fewest that could (docs/experiments.md).")
