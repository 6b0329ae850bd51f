"""The confirmation pages' tables beside the hypotheses (issues 28, 46 and 60): the verdict per
dataset, every arm's endpoint with its collapsed seeds marked, the tuning candidates and the
deviations. :mod:`studies.confirmation.pages` assembles the page from them.
"""

from __future__ import annotations

import csv
from pathlib import Path

from sim.results import point_label
from studies.confirmation.collapse import collapsed, floor_text
from studies.confirmation.hypotheses import FIRST, Comparison, Study, verdict
from studies.confirmation.protocol import PRESET_PREFIX


def dataset_verdicts(comparisons: list[Comparison], expected: set[tuple[str, str]],
                     complete: bool, study: Study | None = None) -> list[str]:
    """The per-dataset section: each setting's primary decisions and the verdict."""
    study = study or FIRST
    count = {3: "three", 4: "four"}.get(len(study.primary), str(len(study.primary)))
    md = ["## Per dataset", "",
          f"FedOwen's advantage per dataset (PROTOCOL.md section 6): *confirmed* only where all "
          f"{count} primaries are confirmed in every setting." + ("" if complete else
          " **Interim**: the verdicts below are not the confirmation's."), "",
          f"| dataset | setting | {' | '.join(study.columns)} | the dataset's verdict |",
          "|---|---|" + "---|" * len(study.columns) + "---|"]
    primary = [c for c in comparisons if c.family == "primary"]
    for dataset in sorted({c.dataset for c in primary}):
        rows = [c for c in primary if c.dataset == dataset]
        settings = sorted({c.setting for c in rows})
        missing = sorted(s for d, s in expected if d == dataset and s not in settings)
        ruling = verdict([c.decision for c in rows])
        if missing:
            ruling = f"pending ({', '.join(missing)} not run yet)"
        for setting in settings:
            cells = [f"{c.decision} ({c.against})" if len(study.primary[k].arms) > 1
                     else c.decision
                     for k, c in enumerate(c for c in rows if c.setting == setting)]
            md.append(f"| {dataset} | {setting} | {' | '.join(cells)} | {ruling} |")
    return [*md, ""]


def arm_endpoints(endpoints: dict[str, dict[tuple[str, str], dict[int, float]]],
                  study: Study | None = None) -> list[str]:
    """The every-arm section: per dataset and setting, each arm's mean endpoint over the seeds
    present and its lowest seed, in bold where a seed collapsed
    (:func:`studies.confirmation.collapse.collapsed`:
    below 20% or at the test split's majority-class rate), so a hypothesis won against a
    broken baseline is seen as one."""
    arms = (study or FIRST).arms()
    md = ["## Every arm's endpoint", "",
          "Mean endpoint over the seeds present (the lowest seed's in brackets), %; **bold**, "
          f"with how many seeds: a seed collapsed, {floor_text(sorted(endpoints))}. A "
          "hypothesis won against a "
          "collapsed arm says that the arm failed, not that FedOwen is good; read it beside "
          "equal-weight FedAvg.", "",
          f"| dataset | setting | {' | '.join(arms)} |", "|---|---|" + "---|" * len(arms)]
    for dataset, table in sorted(endpoints.items()):
        for setting in sorted({s for (_, s) in table}):
            cells = []
            for arm in arms:
                values = list(table.get((arm, setting), {}).values())
                cells.append(_endpoint_cell(values, dataset))
            md.append(f"| {dataset} | {setting} | {' | '.join(cells)} |")
    return [*md, ""]


def _endpoint_cell(values: list[float], dataset: str) -> str:
    """``mean (lowest)``; in bold with the count of collapsed seeds where there are some."""
    if not values:
        return "-"
    text = f"{sum(values) / len(values):.1f} ({min(values):.1f})"
    down = sum(collapsed(v, dataset) for v in values)
    return f"**{text}, {down} of {len(values)} collapsed**" if down else text


def tuning_summary(results_root: Path, prefix: str = PRESET_PREFIX) -> list[str]:
    """The tuning tables of every dataset in one: candidate, its mean validation score over
    the tuning seeds and the pick, from the committed ``tune-*-validation.csv``; per setting
    where the CSV has one (columns before ``variant``: ``cifar10, alpha=0.1``). A seed's score
    at the validation split's majority-class rate (or below 20%) is in bold."""
    paths = sorted(results_root.glob(f"{prefix}*/tune-*-validation.csv"))
    datasets = sorted({p.parent.name.removeprefix(prefix) for p in paths})
    md = ["## Tuning (validation split, tuning seeds; test accuracy never read)", "",
          f"**Bold**: a seed's score collapsed, {floor_text(datasets, 'validation')}.", "",
          "| dataset | grid | candidate | validation (%) per seed | mean | picked |",
          "|---|---|---|---|---|---|"]
    for path in paths:
        by_candidate: dict[tuple[str, str], list[tuple[str, float, bool]]] = {}
        with path.open() as fh:
            reader = csv.DictReader(fh)
            fields = list(reader.fieldnames or [])
            keys = fields[:fields.index("variant")]
            for row in reader:
                setting = point_label({k: row[k] for k in keys})
                by_candidate.setdefault((setting, row["variant"]), []).append(
                    (row["seed"], float(row["val_last5"]), row["picked"] == "True"))
        dataset = path.parent.name.removeprefix(prefix)
        grid = path.name.removesuffix("-validation.csv")
        for (setting, name), seeds in by_candidate.items():
            where = f"{dataset}, {setting}" if keys else dataset
            per_seed = ", ".join(_bold(f"{s}: {v:.2f}", collapsed(v, dataset, "validation"))
                                 for s, v, _ in seeds)
            mean = sum(v for _, v, _ in seeds) / len(seeds)
            md.append(f"| {where} | {grid} | {name} | {per_seed} | {mean:.2f} | "
                      f"{'yes' if seeds[0][2] else ''} |")
    return [*md, ""]


def _bold(text: str, bold: bool) -> str:
    return f"**{text}**" if bold else text


def deviations(path: Path) -> list[str]:
    """The report's "Deviations" section: every departure from the protocol, with its reason,
    as ``docs/confirmation/deviations.md`` lists them (written by hand when one happens)."""
    body = path.read_text().strip() if path.exists() else ""
    return ["## Deviations", "", body or "None: every cell so far ran as the protocol says.", ""]
