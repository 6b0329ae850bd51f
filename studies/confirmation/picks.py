"""The second confirmation's picks (docs/confirmation2/PROTOCOL.md section 4), from the cells.

Per setting of every conf/confirm2 preset: each tuned family's pick on the validation split
(FedAvgM, FedProx, FLTrust; Power-of-Choice and Oort where the preset tunes them), the better of
FedAvgM and FedProx (``fedavg-tuned``), and the better selector, which comes from the selection
development grid where it covered the setting (its tuned peers and best peer, seeds 0-4) and from
the preset's ``tune-poc`` / ``tune-oort`` grids elsewhere. Test accuracy is never read.

    python -m studies.confirmation.picks --tuning-results ../runs --selection-results \\
        ../runs/sel-da280a4/results/selection-dev --out docs/confirmation2

reads ``<tuning-results>/confirm2-<dataset>/`` and writes ``picks.md`` (every pick with its
score and source); once every setting has every pick, ``picks.json`` (what ``python -m
studies.confirmation.pages report --study second`` reads); and for each dataset whose picks
are complete ``confirm-<dataset>.toml``: its arms and ``confirm`` grid (per-setting picks as the
grid's ``overrides``) to append to ``conf/confirm2/<dataset>.toml`` in the protocol commit.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.grid import Preset
from sim.presets import load_preset
from sim.results import CellResult, grid_points, load_results, point_label
from studies.adversarial.attack_costs import attacked
from studies.confirmation.protocol import SECOND_PRESET_PREFIX
from studies.confirmation.tuning import BETTER_OF, family_pick
from studies.selection.development import PEERS, setting_key, settings

ROOT = Path(__file__).resolve().parents[2]
#: The confirm grid's arm each tuned selector family's pick becomes (selection-dev's PEERS use
#: the arm names), and the selector group's key in picks.json
#: (studies.confirmation.hypotheses.SECOND).
FAMILY_ARM = {"tune-poc": "power-of-choice", "tune-oort": "oort"}
SELECTOR_KEY = "power-of-choice+oort"


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
        for col in grid_points(grid, grid.column_keys):
            found = family_pick(grid, preset, res, col)
            if found is not None:
                out.setdefault(point_label(col), {})[grid.name] = Pick(
                    str(found[0]), found[1], f"{preset.name} {grid.name}")
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
        out[_dev_setting(s.name)] = {
            family: Pick(s.tuned(family), s.mean(s.tuned(family)), "selection-dev (seeds 0-4)")
            for family in PEERS}
    return out


def _dev_setting(name: str) -> tuple[str, str]:
    """A selection-dev setting name (:func:`studies.selection.development.setting_key`, ``mnist
    alpha=0.01`` or ``femnist``) as ``(dataset, confirm grid column label)``."""
    dataset, _, alpha = name.partition(" ")
    return dataset, alpha or "all"


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
    dev_preset = load_preset(ROOT / "conf" / "selection-dev.toml")
    dev: dict[tuple[str, str], dict[str, Pick]] = {}
    if selection_results is not None:
        dev = selection_picks(dev_preset, load_results(dev_preset, selection_results))
    dev_covered = {_dev_setting(setting_key(c)) for c in dev_preset.cells()
                   if not attacked(c.run_config)}
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
          "section 4). Written by `python -m studies.confirmation.picks`; test accuracy is not "
          "read.",
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


#: The confirm grid's arms in the protocol's order (section 3), and the untuned ones' keys:
#: FedOwen runs as shipped (the app's defaults at the protocol commit; its selection is written
#: out as the default resolves then, since the preset's ``auto-selection`` pins what ``auto``
#: meant for its tuning cells and must not re-mean FedOwen's).
ARMS = ("fedowen", "fedavg-equal", "fedavg-tuned", "fltrust", "power-of-choice", "oort",
        "fedowen-random")
FIXED_ARMS: dict[str, dict[str, Any]] = {
    "fedowen": {}, "fedavg-equal": {"valuation": "none", "selection": "random",
                                    "aggregation": "uniform"},
    "fedowen-random": {"selection": "random"}}


def _keys(candidate: str, preset: Preset, dev: Preset) -> dict[str, Any]:
    """A picked candidate's run-config keys: the tuning preset's variant, else selection-dev's."""
    found = preset.variants.get(candidate, dev.variants.get(candidate))
    if found is None:
        raise KeyError(f"candidate {candidate!r} is a variant of neither {preset.name} nor "
                       f"{dev.name}")
    return dict(found)


def confirm_block(preset: Preset, by_setting: dict[str, dict[str, Any]], seeds: list[int],
                  dev: Preset) -> str:
    """TOML to append to the dataset's conf/confirm2 preset once its picks are complete: the
    arms as ``[variants."<arm>"]`` tables (the first setting's picks) and the ``confirm`` grid,
    whose ``overrides`` give every other setting its own picks; a key one setting's pick sets
    and another's does not is set to the app's default there."""
    from sim.grid import app_config

    axis = preset.grid("tune-fedavgm").column_keys
    points = grid_points(preset.grid("tune-fedavgm"), axis)
    labels = [point_label(p) for p in points]
    chosen = {arm: [_keys(by_setting[label][arm].candidate, preset, dev) for label in labels]
              for arm in ARMS if arm not in FIXED_ARMS}
    defaults = app_config({})

    def full(keys: dict[str, Any], arm: str) -> dict[str, Any]:
        every = {k for variant in chosen[arm] for k in variant}
        return {k: keys.get(k, getattr(defaults, k.replace("-", "_"))) for k in sorted(every)}

    def toml_value(value: Any) -> str:
        return json.dumps(value) if not isinstance(value, bool) else str(value).lower()

    lines = [f"# The second confirmation's arms and grid for {preset.name}, written by",
             "# python -m studies.confirmation.picks from the picks in "
             "docs/confirmation2/picks.md.", ""]
    shipped = {"selection": defaults.choices().selection}
    for arm in ARMS:
        keys = FIXED_ARMS.get(arm) if arm in FIXED_ARMS else full(chosen[arm][0], arm)
        keys = shipped if arm == "fedowen" else keys
        lines += [f'[variants."{arm}"]', *(f"{k} = {toml_value(v)}" for k, v in
                                           (keys or {}).items()), ""]
    overrides = []
    for i, where in enumerate(points[1:], start=1):
        for arm in chosen:
            keys = full(chosen[arm][i], arm)
            if keys != full(chosen[arm][0], arm):
                entry = ", ".join(f"{k} = {toml_value(v)}" for k, v in keys.items())
                place = ", ".join(f"{k} = {toml_value(v)}" for k, v in where.items())
                overrides.append(f'    {{ where = {{ {place}, variant = "{arm}" }}, '
                                 f"set = {{ {entry} }} }},")
    axes = ", ".join([f"seed = {seeds}",
                      *(f"{k} = {[p[k] for p in points]}" for k in axis),
                      f"variant = {json.dumps(list(ARMS))}"])
    lines += ["[[grid]]", 'name = "confirm"', 'kind = "ablation"', 'rows = "variant"',
              'reference = "fedowen"',
              'description = "The second confirmation (docs/confirmation2/PROTOCOL.md): FedOwen '
              'as shipped against the tuned and untuned arms, seeds 200-207, endpoint test '
              'accuracy over rounds 96-100."',
              f"axes = {{ {axes} }}"]
    if overrides:
        lines += ["overrides = [", *overrides, "]"]
    return "\n".join(lines) + "\n"


def write_blocks(picks: dict[str, dict[str, dict[str, Any]]], out: Path) -> list[Path]:
    """``confirm-<dataset>.toml`` (:func:`confirm_block`) for every dataset whose settings all
    have every pick."""
    from studies.confirmation.protocol import SECOND_CONFIRMATION_SEEDS

    dev = load_preset(ROOT / "conf" / "selection-dev.toml")
    paths = []
    for dataset, by_setting in picks.items():
        if any("missing" in arms for arms in by_setting.values()):
            continue
        preset = load_preset(ROOT / "conf" / "confirm2" / f"{dataset}.toml")
        path = out / f"confirm-{dataset}.toml"
        path.write_text(confirm_block(preset, by_setting, list(SECOND_CONFIRMATION_SEEDS), dev))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tuning-results", type=Path, required=True,
                   help="the folder holding each confirm2-<dataset>/ results folder")
    p.add_argument("--selection-results", type=Path, default=None,
                   help="selection-dev's results folder (the selectors where it covered)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "confirmation2")
    args = p.parse_args(argv)
    picks = gather(args.tuning_results, args.selection_results)
    for path in [*write(picks, args.out), *write_blocks(picks, args.out)]:
        print(f"[confirm2-picks] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
