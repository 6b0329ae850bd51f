"""The second confirmation's picks (docs/confirmation2/PROTOCOL.md section 4), from the cells.

Per setting of every conf/confirm2 preset: each tuned family's pick on the validation split
(FedAvgM, FedProx, FLTrust; Power-of-Choice and Oort where the preset tunes them), the better of
FedAvgM and FedProx (``fedavg-tuned``), and the better selector, which comes from the selection
development grid where it covered the setting (its tuned peers and best peer, seeds 0-4) and from
the preset's ``tune-poc`` / ``tune-oort`` grids elsewhere. Test accuracy is never read.

    python -m sim.confirm2_picks --tuning-results ../runs --selection-results \\
        ../runs/sel-da280a4/results/selection-dev --out docs/confirmation2

reads ``<tuning-results>/confirm2-<dataset>/`` and writes ``picks.md`` (every pick with its
score and source) and, once every setting has every pick, ``picks.json`` (what
``python -m sim.confirmation report --study second`` reads).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.grid import Preset, expand_grid
from sim.presets import load_preset
from sim.protocol import SECOND_PRESET_PREFIX
from sim.results import CellResult, grid_points, load_results, point_label
from sim.selection_dev import PEERS, settings
from sim.tuning import BETTER_OF, pick, tuning_scores

ROOT = Path(__file__).resolve().parents[1]
#: The confirm grid's arm each tuned family's pick becomes, and the selector group's key in
#: picks.json (sim.confirmation.SECOND).
FAMILY_ARM = {"tune-fltrust": "fltrust", "tune-poc": "power-of-choice", "tune-oort": "oort"}
SELECTOR_KEY = "power-of-choice+oort"
#: selection-dev's peer families by the confirmation's arm names.
DEV_FAMILY = {"power-of-choice": "power-of-choice", "oort": "oort"}


@dataclass(frozen=True)
class Pick:
    """One family's pick at one setting: its candidate, mean validation score, where from."""

    candidate: str
    score: float
    source: str


def preset_picks(preset: Preset, res: dict[str, CellResult]) -> dict[str, dict[str, Pick]]:
    """``{setting label: {tuning grid: Pick}}``, the families whose every candidate has every
    tuning seed at that setting."""
    out: dict[str, dict[str, Pick]] = {}
    for grid in (g for g in preset.grids if g.kind == "tuning"):
        seeds = {c.config.seed for c in expand_grid(preset, grid)}
        for col in grid_points(grid, grid.column_keys):
            scores = tuning_scores(grid, preset, res, col)
            chosen = pick(scores, seeds)
            if chosen is not None:
                values = scores[chosen]
                out.setdefault(point_label(col), {})[grid.name] = Pick(
                    str(chosen), sum(values.values()) / len(values), f"{preset.name} {grid.name}")
    return out


def selection_picks(dev_preset: Preset, res: dict[str, CellResult]
                    ) -> dict[tuple[str, str], dict[str, Pick]]:
    """selection-dev's tuned peers per clean setting, keyed ``(dataset, setting label)`` as the
    confirm grids label them; only settings with every peer candidate on seeds 0-4."""
    out: dict[tuple[str, str], dict[str, Pick]] = {}
    for s in settings(dev_preset, res):
        if any(len(s.scores.get(c, {}).get("val_accuracy", {})) < 5
               for family in PEERS.values() for c in family):
            continue
        dataset, _, alpha = s.name.partition(" ")
        label = alpha or "all"
        out[(dataset, label)] = {
            arm: Pick(s.tuned(family), s.mean(s.tuned(family)), "selection-dev (seeds 0-4)")
            for arm, family in DEV_FAMILY.items()}
    return out


def setting_picks(tuned: dict[str, Pick], dev: dict[str, Pick] | None) -> dict[str, Any]:
    """Every arm's pick at one setting, or the missing families' names under ``missing``."""
    picks: dict[str, Any] = {}
    missing = []
    fam = [tuned.get(name) for name in BETTER_OF[0]]
    if all(fam):
        best = max((p for p in fam if p), key=lambda p: p.score)  # first listed wins a tie
        picks["fedavg-tuned"] = best
    else:
        missing += [n for n, p in zip(BETTER_OF[0], fam, strict=True) if p is None]
    if "tune-fltrust" in tuned:
        picks["fltrust"] = tuned["tune-fltrust"]
    else:
        missing.append("tune-fltrust")
    selectors = dev if dev is not None else {
        FAMILY_ARM[g]: tuned[g] for g in BETTER_OF[1] if g in tuned}
    if len(selectors) == 2:
        picks.update(selectors)
        better = max(("power-of-choice", "oort"), key=lambda a: selectors[a].score)
        picks[SELECTOR_KEY] = better
    else:
        missing.append("selection-dev" if dev is not None else "tune-poc/tune-oort")
    if missing:
        picks["missing"] = missing
    return picks


def gather(tuning_root: Path, selection_results: Path | None
           ) -> dict[str, dict[str, dict[str, Any]]]:
    """``{dataset: {setting: setting_picks}}`` over every conf/confirm2 preset."""
    dev: dict[tuple[str, str], dict[str, Pick]] = {}
    if selection_results is not None:
        dev_preset = load_preset(ROOT / "conf" / "selection-dev.toml")
        dev = selection_picks(dev_preset, load_results(dev_preset, selection_results))
    dev_covered = {(c.config.dataset, point_label(
        {} if c.config.dataset == "femnist" else {"alpha": c.config.alpha}))
        for c in load_preset(ROOT / "conf" / "selection-dev.toml").cells()}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted((ROOT / "conf" / "confirm2").glob("*.toml")):
        preset = load_preset(path)
        dataset = preset.name.removeprefix(SECOND_PRESET_PREFIX)
        res = load_results(preset, tuning_root / preset.name)
        tuned = preset_picks(preset, res)
        grid = preset.grid("tune-fedavgm")
        for col in grid_points(grid, grid.column_keys):
            label = point_label(col)
            covered = (dataset, label) in dev_covered
            out.setdefault(dataset, {})[label] = setting_picks(
                tuned.get(label, {}), dev.get((dataset, label), {}) if covered else None)
    return out


def write(picks: dict[str, dict[str, dict[str, Any]]], out: Path) -> list[Path]:
    """``picks.md`` always; ``picks.json`` only when no setting misses a pick."""
    out.mkdir(parents=True, exist_ok=True)
    md = ["# The second confirmation's picks", "",
          "Each family's pick on the validation split (mean of rounds 96-100 over its seeds), "
          "where it comes from, and the arm it becomes (docs/confirmation2/PROTOCOL.md "
          "section 4). Written by `python -m sim.confirm2_picks`; test accuracy is not read.",
          "", "| dataset | setting | arm | pick | validation (%) | from |",
          "|---|---|---|---|---|---|"]
    complete = True
    for dataset, by_setting in picks.items():
        for setting, arms in by_setting.items():
            for arm, p in arms.items():
                if isinstance(p, Pick):
                    md.append(f"| {dataset} | {setting} | {arm} | {p.candidate} | "
                              f"{p.score:.2f} | {p.source} |")
            if SELECTOR_KEY in arms:
                md.append(f"| {dataset} | {setting} | the better selector | "
                          f"{arms[SELECTOR_KEY]} | | |")
            if "missing" in arms:
                complete = False
                md.append(f"| {dataset} | {setting} | not yet | {', '.join(arms['missing'])} "
                          "| | |")
    paths = [out / "picks.md"]
    paths[0].write_text("\n".join(md) + "\n")
    if complete:
        data = {d: {s: {SELECTOR_KEY: a[SELECTOR_KEY]} for s, a in by.items()}
                for d, by in picks.items()}
        paths.append(out / "picks.json")
        paths[1].write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tuning-results", type=Path, required=True,
                   help="the folder holding each confirm2-<dataset>/ results folder")
    p.add_argument("--selection-results", type=Path, default=None,
                   help="selection-dev's results folder (the selectors where it covered)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "confirmation2")
    args = p.parse_args(argv)
    for path in write(gather(args.tuning_results, args.selection_results), args.out):
        print(f"[confirm2-picks] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
