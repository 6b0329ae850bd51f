"""The pre-registered confirmation (issue 28): baselines tuned on a validation split.

A ``tuning`` grid (``kind = "tuning"`` in a preset) runs every candidate (its ``rows`` axis,
usually ``variant``) on the tuning seeds with ``validation-fraction > 0``. A cell's score is
its **validation** accuracy averaged over the last :data:`~sim.results.LAST_K` rounds (rounds
96-100 of 100); a candidate's score is the mean of its seeds'; the pick is the best mean (a
tie goes to the candidate listed first). Test accuracy is never read here: the tuning table,
its CSVs and its plot show the validation set alone, so nothing tuned can have looked at the
numbers the confirmation is scored on.

Every grid point other than the rows and the seed is a column with a pick of its own.

The confirmation itself is an ``ablation`` grid called ``confirm`` in each dataset's preset
(reference: ``fedowen``); its report's ``confirm-rounds.csv.gz`` is committed, and
``python -m sim.confirmation report`` reads those CSVs alone to write ``docs/confirmation.md``:
every primary and secondary hypothesis (paired t and Wilcoxon over the confirmation seeds,
Holm within each family, the decision) and the tuning tables.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sim.compact import ROUNDS_SUFFIX, open_csv, rounds_file, save_png
from sim.grid import Grid, Preset, expand_grid
from sim.plots import mean_curve
from sim.results import LAST_K, CellResult, grid_points, matches_point, point_label
from sim.stats import Interval, PairedTest, holm, mean_interval, paired_test

VAL = "val_accuracy"
#: Seeds of the baselines' tuning and of the confirmation itself; no earlier result used either
#: (tests/test_confirmation.py checks every committed archive and preset).
TUNING_SEEDS = (50, 51)
CONFIRMATION_SEEDS = tuple(range(100, 108))
#: The presets (conf/confirm/<dataset>.toml) and report folders of the confirmation.
PRESET_PREFIX = "confirm-"
#: The second confirmation's (issue 46): seeds no committed result or preset used before it,
#: its presets (conf/confirm2/<dataset>.toml, tuning on TUNING_SEEDS) and report folders.
SECOND_CONFIRMATION_SEEDS = tuple(range(200, 208))
SECOND_PRESET_PREFIX = "confirm2-"


def tuning_scores(grid: Grid, preset: Preset, res: dict[str, CellResult], col: dict[str, Any]
                  ) -> dict[Any, dict[int, float]]:
    """``{candidate: {seed: validation accuracy (%) of its last rounds}}`` at column ``col``,
    finished cells only."""
    cells = [res[c.cell_id] for c in expand_grid(preset, grid)]
    scores: dict[Any, dict[int, float]] = {}
    for row in grid_points(grid, [grid.rows]):
        found = scores.setdefault(row[grid.rows], {})
        for r in cells:
            if matches_point(r.cell, {**col, **row}):
                value = r.last_k_accuracy(LAST_K, key=VAL)
                if value is not None:
                    found[r.cell.config.seed] = value
    return scores


def pick(scores: dict[Any, dict[int, float]], seeds: set[int]) -> Any:
    """The candidate with the best mean over seeds (the first listed on a tie); ``None``
    until every candidate has every one of the grid's tuning ``seeds``."""
    if not scores or not seeds or any(set(v) != seeds for v in scores.values()):
        return None
    means = {name: sum(v.values()) / len(v) for name, v in scores.items()}
    best = max(means.values())
    return next(name for name, m in means.items() if m == best)


def tuning_section(grid: Grid, preset: Preset, res: dict[str, CellResult], out: Path
                   ) -> tuple[list[str], list[Path]]:
    """Markdown lines and files (scores CSV, per-round CSV, validation curves PNG) of one
    tuning grid."""
    cols = grid_points(grid, grid.column_keys)
    planned = expand_grid(preset, grid)
    done = sum(res[c.cell_id].finished for c in planned)
    md = [f"## {grid.name}", "", grid.description, "",
          f"Cells finished: {done} of {len(planned)}. Validation accuracy (%) averaged over the "
          f"last {LAST_K} rounds, per tuning seed and mean ± 95% CI over them; the pick is the "
          "best mean (a tie: the first listed). Test accuracy is not read.", ""]
    score_rows: list[dict[str, Any]] = []
    for col in cols:
        scores = tuning_scores(grid, preset, res, col)
        chosen = pick(scores, {c.config.seed for c in planned})
        seeds = sorted({s for v in scores.values() for s in v})
        if col:
            md += [f"### {', '.join(f'{k}={v}' for k, v in col.items())}", ""]
        md += [f"| {grid.rows} | settings | " + " | ".join(f"seed {s}" for s in seeds)
               + " | mean ± CI | pick |",
               "|---|---|" + "---|" * len(seeds) + "---|---|"]
        for name, by_seed in scores.items():
            interval = mean_interval(list(by_seed.values()))
            settings = _settings(preset, grid, name)
            md.append(f"| {name} | {settings} | "
                      + " | ".join(_pct(by_seed.get(s)) for s in seeds)
                      + f" | {_text(interval)} | {'**picked**' if name == chosen else ''} |")
            score_rows += [{**col, grid.rows: name, "seed": s, "val_last5": f"{v:.4f}",
                            "picked": name == chosen} for s, v in sorted(by_seed.items())]
        md += ["", f"Pick: **{chosen}**" if chosen is not None
               else "Pick: none yet (every candidate needs every tuning seed).", ""]
    scores_csv = out / f"{grid.name}-validation.csv"
    _write_csv(scores_csv, score_rows, [*grid.column_keys, grid.rows, "seed", "val_last5",
                                        "picked"])
    rounds_csv = out / f"{grid.name}{ROUNDS_SUFFIX}"
    _write_csv(rounds_csv, _round_rows(grid, planned, res),
               [*grid.column_keys, grid.rows, "seed", "round", "val_accuracy"])
    png = plot_validation(grid, preset, res, out / f"{grid.name}-validation.png")
    md += [f"Scores: [{scores_csv.name}]({scores_csv.name}); per-round validation accuracy: "
           f"[{rounds_csv.name}]({rounds_csv.name}).", "", f"![{png.stem}]({png.name})", ""]
    return md, [scores_csv, rounds_csv, png]


#: Pairs of tuning grids of which the second confirmation's report names the better family pick
#: (the higher score; on a tie the first listed): "the better of FedAvgM and FedProx" (rule 2 of
#: conf/confirm2/*.toml) and, where the selectors are tuned there, the better selector.
BETTER_OF = (("tune-fedavgm", "tune-fedprox"), ("tune-poc", "tune-oort"))


def better_of_sections(preset: Preset, res: dict[str, CellResult]) -> list[str]:
    """:func:`better_of_section` for every pair of :data:`BETTER_OF` the preset tunes."""
    return [line for pair in BETTER_OF for line in better_of_section(preset, res, pair)]


def better_of_section(preset: Preset, res: dict[str, CellResult],
                      families: tuple[str, ...] = BETTER_OF[0]) -> list[str]:
    """Markdown lines: per column point, each family's pick with its score and the better
    family's pick; none until every family has its pick there. Empty when the preset lacks
    one of the families' grids or is not the second confirmation's (the first ran both)."""
    names = {g.name for g in preset.grids}
    if not preset.name.startswith(SECOND_PRESET_PREFIX) or not set(families) <= names:
        return []
    grids = [preset.grid(name) for name in families]
    md = [f"## The better of {' and '.join(families)}", "",
          "Per setting, each family's pick and its score (validation accuracy of the last "
          f"{LAST_K} rounds, mean over the tuning seeds); the better family's pick goes on (a "
          "tie: the first listed). Test accuracy is not read.", "",
          "| setting | " + " | ".join(families) + " | goes on |",
          "|---|" + "---|" * len(families) + "---|"]
    for col in grid_points(grids[0], grids[0].column_keys):
        picks: list[tuple[Any, float] | None] = []
        for grid in grids:
            scores = tuning_scores(grid, preset, res, col)
            chosen = pick(scores, {c.config.seed for c in expand_grid(preset, grid)})
            picks.append(None if chosen is None else
                         (chosen, sum(scores[chosen].values()) / len(scores[chosen])))
        done = [p for p in picks if p is not None]
        best = max(p[1] for p in done) if len(done) == len(picks) else None
        winner = next((p[0] for p in done if p[1] == best), None)
        setting = ", ".join(f"{k}={v}" for k, v in col.items()) or "-"
        md.append(f"| {setting} | "
                  + " | ".join("not yet" if p is None else f"{p[0]} ({p[1]:.2f})"
                               for p in picks)
                  + f" | {'**' + str(winner) + '**' if winner is not None else 'not yet'} |")
    return [*md, ""]


def _settings(preset: Preset, grid: Grid, name: Any) -> str:
    keys = preset.variants.get(str(name)) if grid.rows == "variant" else {grid.rows: name}
    return ", ".join(f"{k} = {v}" for k, v in (keys or {}).items())


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _text(interval: Interval) -> str:
    return interval.text() if interval.n and not math.isnan(interval.mean) else "-"


def _round_rows(grid: Grid, planned: list[Any], res: dict[str, CellResult]
                ) -> list[dict[str, Any]]:
    rows = []
    for cell in planned:
        rounds, acc = res[cell.cell_id].curve(VAL)
        base = {k: cell.point.get(k) for k in grid.column_keys}
        base.update({grid.rows: cell.point.get(grid.rows), "seed": cell.config.seed})
        rows += [{**base, "round": int(r), "val_accuracy": f"{a:.2f}"}
                 for r, a in zip(rounds, acc, strict=True)]
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]], fields: list[str]) -> None:
    with open_csv(path, "w") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot_validation(grid: Grid, preset: Preset, res: dict[str, CellResult], path: Path) -> Path:
    """Validation accuracy vs round, one line per candidate (mean over the tuning seeds,
    ±1 std band), one panel per column point."""
    cols = grid_points(grid, grid.column_keys)
    fig, axes = plt.subplots(1, len(cols), figsize=(5.5 * len(cols), 4.2), squeeze=False,
                             layout="constrained")
    cells = [res[c.cell_id] for c in expand_grid(preset, grid)]
    for ax, col in zip(axes.flat, cols, strict=True):
        for row in grid_points(grid, [grid.rows]):
            x, mean, std = mean_curve([r for r in cells if matches_point(r.cell, {**col, **row})],
                                      key=VAL)
            if not len(x):
                continue
            (line,) = ax.plot(x, mean, label=str(row[grid.rows]), lw=1.4)
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.12)
        title = ", ".join(f"{k}={v}" for k, v in col.items()) or grid.name
        ax.set(title=title, xlabel="round", ylabel="validation accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{preset.name} / {grid.name}: validation accuracy (mean over tuning seeds, "
                 "±1 std)")
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ the confirmation's report

#: The arm every hypothesis is about, and the grid that holds the confirmation cells (an
#: ``ablation`` grid with this reference in every conf/confirm/<dataset>.toml).
REFERENCE = "fedowen"
CONFIRM_GRID = "confirm"
#: Departures from the protocol, by hand, beside it (docs/confirmation/deviations.md).
DEVIATIONS = "deviations.md"
#: The protocol's picks of "the better of" groups chosen before the scored seeds (a Study with
#: ``picked`` hypotheses): ``{dataset: {setting: {group key: arm}}}``.
PICKS = "picks.json"
#: Primary hypotheses, per dataset x setting: FedOwen beats each; a tuple is "the better of"
#: (the one with the higher mean endpoint on the confirmation seeds: the harder comparison).
PRIMARY: tuple[tuple[str, ...], ...] = (("fedavg-equal",), ("fedavgm", "fedprox"), ("fltrust",))
SECONDARY: tuple[tuple[str, ...], ...] = (("fedavg-samples",), ("fedowen-random",))
#: The primary endpoint: test accuracy (%) averaged over these rounds.
ENDPOINT_ROUNDS = tuple(range(96, 101))
LEVEL = 0.05
HYPOTHESIS_FIELDS = ("family", "dataset", "setting", "against", "n", "mean_diff", "ci_lo",
                     "ci_hi", "p_t", "p_wilcoxon", "p_holm", "decision")


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


def compare(endpoints: dict[str, dict[tuple[str, str], dict[int, float]]],
            study: Study | None = None, picks: dict[str, Any] | None = None
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
    """The comparisons as CSV rows (4 decimals: the report's own precision)."""
    def num(x: float) -> str:
        return "" if math.isnan(x) else f"{x:.4f}"

    return [{"family": c.family, "dataset": c.dataset, "setting": c.setting,
             "against": c.against, "n": c.test.diff.n, "mean_diff": num(c.test.diff.mean),
             "ci_lo": num(c.test.diff.lo), "ci_hi": num(c.test.diff.hi), "p_t": num(c.test.p_t),
             "p_wilcoxon": num(c.test.p_wilcoxon), "p_holm": num(c.p_holm),
             "decision": c.decision} for c in comparisons]


def expected_settings(arms_file: Path, prefix: str = PRESET_PREFIX) -> set[tuple[str, str]]:
    """Every (dataset, setting) the protocol plans, from its ``arms.json``; empty without one."""
    if not arms_file.exists():
        return set()
    return {(a["preset"].removeprefix(prefix), a["setting"])
            for a in json.loads(arms_file.read_text())}


def verdict(decisions: list[str]) -> str:
    """One dataset's verdict from its primary decisions (PROTOCOL.md section 6): *confirmed*
    only when every one is, *reversed* when any is, else *partly* or *not confirmed*."""
    confirmed = decisions.count("confirmed")
    if "reversed" in decisions:
        return f"reversed ({confirmed} of {len(decisions)} primaries confirmed)"
    if decisions and confirmed == len(decisions):
        return "confirmed"
    return "partly confirmed" if confirmed else "not confirmed"


def dataset_verdicts(comparisons: list[Comparison], expected: set[tuple[str, str]],
                     complete: bool, study: Study | None = None) -> list[str]:
    """The per-dataset section: each setting's primary decisions and the verdict."""
    study = study or FIRST
    count = {3: "three", 4: "four"}.get(len(study.primary), str(len(study.primary)))
    md = ["## Per dataset", "",
          f"FedOwen's advantage per dataset (PROTOCOL.md section 6): *confirmed* only where all "
          f"{count} primaries are confirmed in every setting." + ("" if complete else
          " **Interim**: the verdicts below are not the confirmation's."), "",
          f"| dataset | setting | {' | '.join(study.columns)} | verdict |",
          "|---|---|" + "---|" * len(study.columns) + "---|"]
    primary = [c for c in comparisons if c.family == "primary"]
    for dataset in sorted({c.dataset for c in primary}):
        rows = [c for c in primary if c.dataset == dataset]
        settings = sorted({c.setting for c in rows})
        missing = sorted(s for d, s in expected if d == dataset and s not in settings)
        ruling = verdict([c.decision for c in rows])
        if missing:
            ruling = f"pending ({', '.join(missing)} not run yet)"
        for i, setting in enumerate(settings):
            cells = [f"{c.decision} ({c.against})" if len(study.primary[k].arms) > 1
                     else c.decision
                     for k, c in enumerate(c for c in rows if c.setting == setting)]
            md.append(f"| {dataset} | {setting} | {' | '.join(cells)} | "
                      f"{ruling if i == 0 else ''} |")
    return [*md, ""]


#: An arm whose endpoint falls below this (%) in a seed collapsed there (the arena's rule).
COLLAPSE_BELOW = 20.0


def arm_endpoints(endpoints: dict[str, dict[tuple[str, str], dict[int, float]]],
                  study: Study | None = None) -> list[str]:
    """The every-arm section: per dataset and setting, each arm's mean endpoint over the seeds
    present and its lowest seed, in bold where a seed collapsed, so a hypothesis won against a
    broken baseline is seen as one."""
    arms = (study or FIRST).arms()
    md = ["## Every arm's endpoint", "",
          "Mean endpoint over the seeds present (the lowest seed's in brackets), %; **bold**: "
          f"some seed below {COLLAPSE_BELOW:.0f}%, a collapsed run. A hypothesis won against a "
          "collapsed arm says that the arm failed, not that FedOwen is good; read it beside "
          "equal-weight FedAvg.", "",
          f"| dataset | setting | {' | '.join(arms)} |", "|---|---|" + "---|" * len(arms)]
    for dataset, table in sorted(endpoints.items()):
        for setting in sorted({s for (_, s) in table}):
            cells = []
            for arm in arms:
                values = list(table.get((arm, setting), {}).values())
                text = f"{sum(values) / len(values):.1f} ({min(values):.1f})" if values else "-"
                cells.append(f"**{text}**" if values and min(values) < COLLAPSE_BELOW else text)
            md.append(f"| {dataset} | {setting} | {' | '.join(cells)} |")
    return [*md, ""]


def confirmation_report(results_root: Path, seeds: int | None = None,
                        expected: set[tuple[str, str]] | None = None,
                        study: Study | None = None, picks: dict[str, Any] | None = None
                        ) -> tuple[str, list[dict[str, Any]]]:
    """docs/confirmation.md's hypotheses and per-dataset sections and its rows, from the
    committed per-round CSVs ``<results_root>/confirm-<dataset>/confirm-rounds.csv.gz`` alone
    (:func:`sim.compact.rounds_file`: a plain ``.csv`` of an older report reads the same);
    ``expected``: every (dataset, setting) the protocol plans (complete only when all ran)."""
    study = study or FIRST
    seeds = len(study.seeds) if seeds is None else seeds
    sources = [path for report in sorted(results_root.glob(f"{study.prefix}*"))
               if report.is_dir() and (path := rounds_file(report, CONFIRM_GRID))]
    endpoints = {p.parent.name.removeprefix(study.prefix): read_endpoints(p) for p in sources}
    comparisons = compare(endpoints, study, picks)
    ran = {(c.dataset, c.setting) for c in comparisons}
    complete = (bool(comparisons) and all(c.test.diff.n == seeds for c in comparisons)
                and (expected or set()) <= ran)
    md = ["## Hypotheses", "",
          f"FedOwen's endpoint (test accuracy, mean of rounds {ENDPOINT_ROUNDS[0]}-"
          f"{ENDPOINT_ROUNDS[-1]}) minus the other arm's, paired by seed: mean and 95% CI, "
          "two-sided paired t-test (the decision's) and Wilcoxon signed-rank beside it; Holm "
          f"over every primary together and over every secondary together; level {LEVEL}.",
          "", "Status: " + ("complete." if complete else
                            f"**interim**: {len(ran)} of {len(expected or ran)} settings have "
                            f"results, and not every comparison may have its {seeds} seeds "
                            "yet; Holm runs over the hypotheses present, so the decisions below "
                            "are not the confirmation's."), ""]
    for family in ("primary", "secondary"):
        rows = [c for c in comparisons if c.family == family]
        md += [f"### {family.capitalize()}", "",
               "| dataset | setting | FedOwen vs | n | difference (points) [95% CI] | p (t) "
               "| p (Wilcoxon) | p (Holm) | decision |",
               "|---|---|---|---|---|---|---|---|---|"]
        for c in rows:
            d = c.test.diff
            ci = "-" if d.n < 2 else f"{d.mean:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}]"
            md.append(f"| {c.dataset} | {c.setting} | {c.against} | {d.n} | {ci} | "
                      f"{_p(c.test.p_t)} | {_p(c.test.p_wilcoxon)} | {_p(c.p_holm)} | "
                      f"{c.decision} |")
        md.append("")
    md += dataset_verdicts(comparisons, expected or set(), complete, study)
    md += arm_endpoints(endpoints, study)
    return "\n".join(md), hypothesis_rows(comparisons)


def _p(p: float) -> str:
    if math.isnan(p):
        return "-"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def tuning_summary(results_root: Path, prefix: str = PRESET_PREFIX) -> list[str]:
    """The tuning tables of every dataset in one: candidate, its mean validation score over
    the tuning seeds and the pick, from the committed ``tune-*-validation.csv``."""
    md = ["## Tuning (validation split, tuning seeds; test accuracy never read)", "",
          "| dataset | grid | candidate | validation (%) per seed | mean | picked |",
          "|---|---|---|---|---|---|"]
    for path in sorted(results_root.glob(f"{prefix}*/tune-*-validation.csv")):
        by_candidate: dict[str, list[tuple[str, float, bool]]] = {}
        with path.open() as fh:
            for row in csv.DictReader(fh):
                by_candidate.setdefault(row["variant"], []).append(
                    (row["seed"], float(row["val_last5"]), row["picked"] == "True"))
        dataset = path.parent.name.removeprefix(prefix)
        grid = path.name.removesuffix("-validation.csv")
        for name, seeds in by_candidate.items():
            per_seed = ", ".join(f"{s}: {v:.2f}" for s, v, _ in seeds)
            mean = sum(v for _, v, _ in seeds) / len(seeds)
            md.append(f"| {dataset} | {grid} | {name} | {per_seed} | {mean:.2f} | "
                      f"{'yes' if seeds[0][2] else ''} |")
    return [*md, ""]


def deviations(path: Path) -> list[str]:
    """The report's "Deviations" section: every departure from the protocol, with its reason,
    as ``docs/confirmation/deviations.md`` lists them (written by hand when one happens)."""
    body = path.read_text().strip() if path.exists() else ""
    return ["## Deviations", "", body or "None: every cell so far ran as the protocol says.", ""]


def write_confirmation(results_root: Path, out_md: Path, out_csv: Path,
                       study: Study | None = None) -> list[Path]:
    """The study's page (``docs/confirmation.md``) and its hypotheses CSV, regenerated from
    the committed CSVs under ``results_root`` (byte-identical for the same CSVs); the protocol
    files are read from ``out_md``'s folder's ``<study folder>/``."""
    study = study or FIRST
    folder = out_md.parent / study.folder
    picks_file = folder / PICKS
    picks = json.loads(picks_file.read_text()) if picks_file.exists() else None
    hypotheses_md, rows = confirmation_report(
        results_root, expected=expected_settings(folder / "arms.json", study.prefix),
        study=study, picks=picks)
    plots = sorted(results_root.glob(f"{study.prefix}*/{CONFIRM_GRID}-accuracy.png"))
    md = [f"# {study.title}", "",
          "The protocol, committed before the first confirmation cell: "
          f"[{study.folder}/PROTOCOL.md]({study.folder}/PROTOCOL.md). Regenerate this page from "
          "the committed per-round CSVs with `python -m sim.confirmation report"
          + ("" if study is FIRST else f" --study {_name(study)}") + "`.", "",
          hypotheses_md, *deviations(folder / DEVIATIONS),
          *tuning_summary(results_root, study.prefix), "## Accuracy per round", ""]
    for png in plots:
        rel = png.relative_to(out_md.parent)
        md += [f"### {png.parent.name.removeprefix(study.prefix)}", "", f"![{rel}]({rel})", ""]
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(md) + "\n")
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    _write_csv(out_csv, rows, list(HYPOTHESIS_FIELDS))
    return [out_md, out_csv]


def _name(study: Study) -> str:
    return next(name for name, known in STUDIES.items() if known is study)


# ------------------------------------------------------------------ the protocol's arms

#: Per-run keys that differ between the seeds and machines of one arm by design.
_PER_RUN = ("seed", "output_dir", "data_dir", "resume_from")
#: Keys the app gained after the protocol commit (839845a), with the value that runs as the
#: code did before them: a config without them (a cell's config.json written then, or a
#: preset that leaves them to the defaults, which have changed since) ran at that value, and
#: at that value they are left out of an arm's resolved config, so the protocol's hashes keep
#: naming the same runs.
ADDED_AFTER_PROTOCOL = {"value_cap_multiple": 0.0, "value_cap_mode": "at-most", "link_memory": 0,
                        "poc_d": 20, "oort_exploration_min": 0.3, "selection_reward": "rank",
                        "selection_level": 0.01, "selection_cap": 0.0,
                        "adversary_trigger": "square", "adversary_trigger_size": 3,
                        "adversary_trigger_position": "bottom-right", "adversary_target": 0,
                        "adversary_poison_fraction": 0.5, "update_filter": "none",
                        "robust_lr_threshold": 0, "aggregate_noise": 0.0, "valuation_workers": 1}


def resolved_arm(config: dict[str, Any]) -> dict[str, Any]:
    """The full run config an arm runs with, as the ServerApp resolves it (every key, the
    defaults included; ``auto`` selection, aggregation and norm cap resolved), less the
    per-run keys. ``config`` is a run config (kebab-case) or a cell's config.json."""
    from server_app.config import parse_run_config

    given = {k.replace("-", "_"): v for k, v in config.items()}
    cfg = parse_run_config({k.replace("_", "-"): v
                            for k, v in {**ADDED_AFTER_PROTOCOL, **given}.items()
                            if k not in _PER_RUN})
    choices = cfg.choices()
    resolved = {k: v for k, v in asdict(cfg).items() if k not in _PER_RUN
                and not (k in ADDED_AFTER_PROTOCOL and ADDED_AFTER_PROTOCOL[k] == v)}
    return {**resolved, "selection": choices.selection, "aggregation": choices.aggregation,
            "norm_cap": choices.norm_cap}


def config_hash(config: dict[str, Any]) -> str:
    """12 hex digits of the SHA-256 of :func:`resolved_arm`: one per arm and setting, the
    same in the protocol and in every cell that ran it."""
    text = json.dumps(resolved_arm(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _setting(grid: Grid, cell: Any) -> str:
    """The cell's column label, exactly as the ablation report's rounds CSV writes it (the
    report's hypotheses are keyed by that label)."""
    return point_label({k: cell.point[k] for k in grid.column_keys})


def protocol_arms(preset: Preset) -> list[dict[str, Any]]:
    """Every arm x setting of the preset's ``confirm`` grid: its hash, seeds and full
    resolved run config (docs/confirmation/arms.json)."""
    grid = preset.grid(CONFIRM_GRID)
    arms: dict[tuple[str, str], dict[str, Any]] = {}
    for cell in expand_grid(preset, grid):
        setting = _setting(grid, cell)
        entry = arms.setdefault((str(cell.point[grid.rows]), setting), {
            "preset": preset.name, "arm": str(cell.point[grid.rows]), "setting": setting,
            "hash": config_hash(cell.run_config), "seeds": [],
            "num_supernodes": preset.num_supernodes,
            "run_config": resolved_arm(cell.run_config)})
        entry["seeds"].append(cell.config.seed)
        if config_hash(cell.run_config) != entry["hash"]:
            raise ValueError(f"{preset.name}: arm {entry['arm']} at {setting} differs between "
                             "seeds in more than the seed")
    return list(arms.values())


def check_cells(arms: list[dict[str, Any]], preset: Preset, results: Path) -> list[str]:
    """What is wrong with the confirmation cells under ``results``: a cell whose recorded
    config (config.json) hashes otherwise than its arm in the protocol, or that ran from a
    checkout with uncommitted changes (code.json). A cell carried from the committed rows
    (``sim.carry``) is checked when the report's records archive gave it both files; one
    without them is not: :func:`main` counts those."""
    from sim.runner import CODE_FILE

    expected = {(a["arm"], a["setting"]): a["hash"] for a in arms if a["preset"] == preset.name}
    grid = preset.grid(CONFIRM_GRID)
    problems = []
    for cell in expand_grid(preset, grid):
        setting = _setting(grid, cell)
        recorded = results / cell.cell_id / "config.json"
        if not recorded.exists():
            continue
        arm = str(cell.point[grid.rows])
        got = config_hash(json.loads(recorded.read_text()))
        if got != expected.get((arm, setting)):
            problems.append(f"{cell.cell_id} ({arm}, {setting}, seed "
                            f"{cell.run_config.get('seed')}): config hash {got}, protocol "
                            f"{expected.get((arm, setting))}")
        code = results / cell.cell_id / CODE_FILE
        for attempt in json.loads(code.read_text()) if code.exists() else []:
            if attempt.get("dirty"):
                problems.append(f"{cell.cell_id}: attempt {attempt['attempt']} ran on "
                                f"{attempt.get('commit')} with uncommitted changes")
    return problems


def main(argv: list[str] | None = None) -> int:
    import argparse

    from sim.carry import is_carried
    from sim.grid import load_preset

    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(
        prog="python -m sim.confirmation",
        description="report: regenerate docs/confirmation.md (hypotheses with Holm's "
                    "correction, tuning tables, plots) from the committed per-round CSVs. "
                    "arms: write every arm's full resolved run config and hash (the "
                    "protocol's docs/confirmation/arms.json). check: every confirmation cell "
                    "under --results ran the protocol's config, from committed code.")
    parser.add_argument("command", choices=["report", "arms", "check"])
    parser.add_argument("presets", nargs="*", type=Path,
                        help="conf/confirm/<dataset>.toml (arms, check)")
    parser.add_argument("--study", choices=sorted(STUDIES), default="first",
                        help="first: docs/confirmation/ (seeds 100-107); second: "
                             "docs/confirmation2/ (seeds 200-207, conf/confirm2/)")
    parser.add_argument("--results", type=Path, default=None,
                        help="report: the folder of the confirm-<dataset>/ reports (default "
                             "docs/results); check: the preset's cell folder (default "
                             "results/<preset name>)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report: docs/confirmation.md; arms: docs/confirmation/arms.json")
    parser.add_argument("--csv", type=Path, default=None,
                        help="report: docs/<study folder>/hypotheses.csv")
    args = parser.parse_args(argv)
    study = STUDIES[args.study]
    folder = root / "docs" / study.folder
    arms_file = folder / "arms.json"
    if args.command == "report":
        for path in write_confirmation(args.results or root / "docs" / "results",
                                       args.out or root / "docs" / f"{study.folder}.md",
                                       args.csv or folder / "hypotheses.csv", study):
            print(path)
        return 0
    if not args.presets:
        parser.error(f"{args.command} needs the conf/confirm/<dataset>.toml presets")
    presets = [load_preset(p) for p in args.presets]
    if args.command == "arms":
        out = args.out or arms_file
        out.parent.mkdir(parents=True, exist_ok=True)
        arms = [a for p in presets for a in protocol_arms(p)]
        out.write_text(json.dumps(arms, indent=1, sort_keys=True) + "\n")
        print(f"{out}: {len(arms)} arm x setting entries")
        return 0
    arms = json.loads(arms_file.read_text())
    bad, carried = [], 0
    for preset in presets:
        results = args.results or root / "results" / preset.name
        bad += check_cells(arms, preset, results)
        carried += sum(is_carried(results / c.cell_id)
                       and not (results / c.cell_id / "config.json").exists()
                       for c in expand_grid(preset, preset.grid(CONFIRM_GRID)))
    print("\n".join(bad) if bad else "every confirmation cell ran its protocol config "
          "from committed code")
    if carried:
        print(f"{carried} cells carried from committed rows without their config record (not "
              "checked again: checked when their rows were committed)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
