"""The pre-registered confirmations' page and CLI (issues 28 and 46).

The confirmation itself is an ``ablation`` grid called ``confirm`` in each dataset's preset
(reference: ``fedowen``); its report's ``confirm-rounds.csv.gz`` is committed, and
``python -m studies.confirmation.pages report [--study second]`` reads those CSVs alone to write
``docs/confirmation.md`` (``docs/confirmation2.md``): every primary and secondary hypothesis
(:mod:`studies.confirmation.hypotheses`: paired t and Wilcoxon over the confirmation seeds, Holm
within each family, the decision), the per-dataset verdicts, every arm's endpoint and the tuning
tables (:mod:`studies.confirmation.tuning`). The protocol's arms and the cells' check are
:mod:`studies.confirmation.protocol`'s.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from sim.compact import rounds_file
from studies.confirmation.hypotheses import (
    ENDPOINT_ROUNDS,
    FIRST,
    HYPOTHESIS_FIELDS,
    LEVEL,
    STUDIES,
    Comparison,
    Study,
    compare,
    hypothesis_rows,
    read_endpoints,
)
from studies.confirmation.protocol import CONFIRM_GRID, PRESET_PREFIX, check_presets, protocol_arms
from studies.confirmation.robustness import (
    Key,
    keyed,
    nonparametric_note,
    robustness_fields,
    robustness_text,
    seed_flips,
)
from studies.confirmation.tables import (
    arm_endpoints,
    dataset_verdicts,
    deviations,
    tuning_summary,
)
from studies.confirmation.tuning import _write_csv

#: Departures from the protocol, by hand, beside it (docs/confirmation/deviations.md).
DEVIATIONS = "deviations.md"
#: The protocol's picks of "the better of" groups chosen before the scored seeds (a Study with
#: ``picked`` hypotheses): ``{dataset: {setting: {group key: arm}}}``.
PICKS = "picks.json"


def expected_settings(arms_file: Path, prefix: str = PRESET_PREFIX) -> set[tuple[str, str]]:
    """Every (dataset, setting) the protocol plans, from its ``arms.json``; empty without one."""
    if not arms_file.exists():
        return set()
    return {(a["preset"].removeprefix(prefix), a["setting"])
            for a in json.loads(arms_file.read_text())}


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
    flips = seed_flips(endpoints, study, picks)
    md = ["## Hypotheses", "",
          f"FedOwen's endpoint (test accuracy, mean of rounds {ENDPOINT_ROUNDS[0]}-"
          f"{ENDPOINT_ROUNDS[-1]}) minus the other arm's, paired by seed: mean and 95% CI, "
          "two-sided paired t-test (the decision's), the Wilcoxon signed-rank and exact sign "
          "tests beside it; Holm over every primary together and over every secondary "
          f"together; level {LEVEL}. *Without one seed* (reported, not deciding): each seed "
          "left out of every arm in turn and every hypothesis tested again, Holm included; "
          "for a significant decision, how many of those leave it standing and which seeds' "
          "omission changes it.", "",
          nonparametric_note(sum(c.family == "primary" for c in comparisons) or 1, seeds),
          "",
          "Status: " + ("complete." if complete else
                        f"**interim**: {len(ran)} of {len(expected or ran)} settings have "
                        f"results, and not every comparison may have its {seeds} seeds "
                        "yet; Holm runs over the hypotheses present, so the decisions below "
                        "are not the confirmation's."), ""]
    for family in ("primary", "secondary"):
        md += family_table(family, keyed(comparisons), flips)
    md += dataset_verdicts(comparisons, expected or set(), complete, study)
    md += arm_endpoints(endpoints, study)
    rows = [{**row, **robustness_fields(c.decision, flips[key], c.test.diff.n)}
            for row, (key, c) in zip(hypothesis_rows(comparisons), keyed(comparisons).items(),
                                     strict=True)]
    return "\n".join(md), rows


def family_table(family: str, comparisons: dict[Key, Comparison],
                 flips: dict[Key, list[tuple[int, str]]]) -> list[str]:
    """One family's table of hypotheses: the tests, the decision and its robustness."""
    md = [f"### {family.capitalize()}", "",
          "| dataset | setting | FedOwen vs | n | difference (points) [95% CI] | p (t) "
          "| p (Wilcoxon) | p (sign) | p (Holm) | decision | without one seed |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, c in comparisons.items():
        if c.family != family:
            continue
        d = c.test.diff
        ci = "-" if d.n < 2 else f"{d.mean:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}]"
        md.append(f"| {c.dataset} | {c.setting} | {c.against} | {d.n} | {ci} | "
                  f"{_p(c.test.p_t)} | {_p(c.test.p_wilcoxon)} | {_p(c.test.p_sign)} | "
                  f"{_p(c.p_holm)} | {c.decision} | "
                  f"{robustness_text(c.decision, flips[key], d.n)} |")
    return [*md, ""]


def _p(p: float) -> str:
    if math.isnan(p):
        return "-"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


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
          "the committed per-round CSVs with `python -m studies.confirmation.pages report"
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


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m studies.confirmation.pages``."""
    parser = argparse.ArgumentParser(
        prog="python -m studies.confirmation.pages",
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
    parser.add_argument("--committed", action="store_true",
                        help="check: the cells a fresh clone holds (archives/<preset>/ and "
                             "docs/results/<preset>/), nothing else")
    return parser


def main(argv: list[str] | None = None) -> int:
    from sim.presets import PresetError, load_preset

    root = Path(__file__).resolve().parents[2]
    parser = _parser()
    args = parser.parse_intermixed_args(argv)  # options before or after the presets
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
    try:
        presets = [load_preset(p) for p in args.presets]
    except PresetError as err:
        parser.error(str(err))
    if args.command == "arms":
        out = args.out or arms_file
        out.parent.mkdir(parents=True, exist_ok=True)
        arms = [a for p in presets for a in protocol_arms(p)]
        out.write_text(json.dumps(arms, indent=1, sort_keys=True) + "\n")
        print(f"{out}: {len(arms)} arm x setting entries")
        return 0
    if args.committed and args.results:
        parser.error("check takes --results (a folder of cells) or --committed, not both")
    bad, counts = check_presets(presets, json.loads(arms_file.read_text()), root,
                                args.results, args.committed)
    print("\n".join(bad) if bad else "every confirmation cell found ran its protocol config "
          "from committed code")
    where = "the committed archives and rows" if args.committed else "the results folder"
    print(f"{counts['checked']} confirmation cells checked; {counts['carried']} carried from "
          "committed rows without their config record (not checked again: checked when their "
          f"rows were committed); {counts['absent']} not found in {where}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
