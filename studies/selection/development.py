"""The selection development grid's rule (conf/selection-dev.toml, issue 43), read from its cells.

Per clean setting (dataset and alpha of the ablation grids), every arm's validation and test
accuracy (mean of the last 5 rounds) over the seeds finished, with paired 95% t-intervals
against FedOwen with random selection and against the setting's best peer selector; the share
of distinct clients each run selected. Then the preset's rule: peers tuned and the best peer
picked on validation accuracy, each contender's eligibility (never below random selection or
the best peer beyond the paired interval, no attacked run collapsed), and the contender it
adopts. Test accuracy is reported, never used.

    python -m studies.selection.development conf/selection-dev.toml \\
        --results results/selection-dev --out docs/results/selection-dev

writes ``selection.md``, ``selection-arms.csv`` (one row per setting and arm),
``selection-seeds.csv`` (one row per finished cell) and ``selection-val.png``. With
``--device-results DIR`` (cells run on a lent accelerator), a setting whose cells all finished
there is read from there, every other setting from ``--results`` (the preset's rule: device
cells differ in float rounding, so no setting mixes machines); ``selection.md`` says which.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.grid import Cell, Preset
from sim.presets import load_preset
from sim.results import LAST_K, CellResult, load_results
from sim.stats import Interval, mean_interval, paired_interval
from studies.adversarial.attack_costs import attacked, collapsed
from studies.selection.cells import (
    TEST,
    VAL,
    cell_scores,
    distinct_share,
    setting_key,
    top_share,
    write_csv,
)

#: The peers' tuning candidates, by family (equal weights).
PEERS = {"power-of-choice": ("poc-d20", "poc-d50"), "oort": ("oort-x0.3", "oort-x0.1")}
#: Who may become the default selection, and the arm every comparison is paired against.
CONTENDERS = ("fedowen", "fedowen-random", "posterior-rank", "posterior-phi")
RANDOM = "fedowen-random"


@dataclass(frozen=True)
class Setting:
    """One clean setting's finished cells: ``scores[arm][metric][seed]``, each cell's share
    of distinct clients selected and its most selected client's count over the mean count."""

    name: str
    scores: dict[str, dict[str, dict[int, float]]]
    distinct: dict[str, dict[int, float]]
    top: dict[str, dict[int, float]] = field(default_factory=dict)

    def mean(self, arm: str, metric: str = VAL) -> float:
        values = list(self.scores.get(arm, {}).get(metric, {}).values())
        return sum(values) / len(values) if values else -math.inf

    def tuned(self, family: str) -> str:
        """The family's candidate of the higher mean validation accuracy."""
        return max(PEERS[family], key=self.mean)

    def best_peer(self) -> str:
        return max((self.tuned(f) for f in PEERS), key=self.mean)

    def diff(self, arm: str, reference: str, metric: str = VAL) -> Interval:
        return paired_interval(self.scores.get(arm, {}).get(metric, {}),
                               self.scores.get(reference, {}).get(metric, {}))


def settings(preset: Preset, res: Mapping[str, CellResult]) -> list[Setting]:
    """The clean settings (ablation grids without attackers), in preset order."""
    out: dict[str, Setting] = {}
    for cell in preset.cells():
        result = res[cell.cell_id]
        if attacked(cell.run_config) or not result.finished:
            continue
        name = setting_key(cell)
        setting = out.setdefault(name, Setting(name, {}, {}))
        arm, seed = cell.point["variant"], cell.config.seed
        for metric, value in cell_scores(result).items():
            setting.scores.setdefault(arm, {}).setdefault(metric, {})[seed] = value
        setting.distinct.setdefault(arm, {})[seed] = distinct_share(result,
                                                                   preset.num_supernodes)
        setting.top.setdefault(arm, {})[seed] = top_share(result, preset.num_supernodes)
    return list(out.values())


def merge_machines(preset: Preset, cpu: Mapping[str, CellResult],
                   device: Mapping[str, CellResult] | None
                   ) -> tuple[dict[str, CellResult], dict[str, str]]:
    """Each cell's result from the machine its setting is read from: the device where every
    cell of the setting finished there, else the CPU runs; and each setting's machine."""
    by_setting: dict[str, list[Cell]] = {}
    for cell in preset.cells():
        by_setting.setdefault(setting_key(cell), []).append(cell)
    merged, machine = dict(cpu), {}
    for key, cells in by_setting.items():
        whole = device is not None and all(device[c.cell_id].finished for c in cells)
        machine[key] = "device" if whole else "CPU"
        if whole and device is not None:
            merged.update({c.cell_id: device[c.cell_id] for c in cells})
    return merged, machine


def collapses(preset: Preset, res: Mapping[str, CellResult]) -> dict[str, list[str]]:
    """Per arm, the attacked cells (``grid seed=s kind``) whose run collapsed."""
    out: dict[str, list[str]] = {}
    for cell in preset.cells():
        result = res[cell.cell_id]
        if attacked(cell.run_config) and result.finished and collapsed(result):
            out.setdefault(cell.point["variant"], []).append(
                f"{cell.grid} seed={cell.config.seed} {cell.config.adversary_kind}")
    return out


def arm_rows(found: Sequence[Setting]) -> list[dict[str, Any]]:
    """One row per setting and arm: accuracies, paired differences, distinct share."""
    rows = []
    for s in found:
        peer = s.best_peer()
        for arm in s.scores:
            row: dict[str, Any] = {"setting": s.name, "arm": arm,
                                   "n": len(s.scores[arm].get(VAL, {})), "best_peer": peer}
            for metric, tag in ((VAL, "val"), (TEST, "test")):
                iv = mean_interval(list(s.scores[arm].get(metric, {}).values()))
                row[tag], row[f"{tag}_half"] = iv.mean, iv.half
                for ref, name in ((RANDOM, "random"), (peer, "peer")):
                    d = s.diff(arm, ref, metric)
                    row[f"{tag}_vs_{name}"], row[f"{tag}_vs_{name}_half"] = d.mean, d.half
            row["distinct"] = mean_interval(list(s.distinct[arm].values())).mean
            row["top"] = mean_interval(list(s.top[arm].values())).mean
            rows.append(row)
    return rows


def mean_vals(found: Sequence[Setting]) -> dict[str, float]:
    """Each contender's validation accuracy averaged over the settings where every contender
    has finished seeds (all of them once the grid is complete; an interim reading must not rank
    an arm down for a missing cell)."""
    shared = [s for s in found if all(a in s.scores for a in CONTENDERS)]
    return {a: (sum(s.mean(a) for s in shared) / len(shared) if shared else -math.inf)
            for a in CONTENDERS}


def verdict(found: Sequence[Setting], collapsed_runs: Mapping[str, list[str]]
            ) -> tuple[str | None, dict[str, list[str]]]:
    """The rule: each contender's failures (settings where it is below random selection or
    the best peer beyond the paired interval on validation accuracy; collapsed attacked runs)
    and the contender adopted (the eligible one of the highest validation accuracy averaged
    over settings, :func:`mean_vals`; else the fewest failures, then the higher mean)."""
    failures: dict[str, list[str]] = {}
    for arm in CONTENDERS:
        fails = [f"{run} collapsed" for run in collapsed_runs.get(arm, [])]
        for s in found:
            for ref in (RANDOM, s.best_peer()):
                d = s.diff(arm, ref)
                if d.n > 1 and d.hi < 0:
                    fails.append(f"{s.name}: {d.text(signed=True)} vs {ref}")
        failures[arm] = fails
    means = mean_vals(found)
    ranked = sorted(CONTENDERS, key=lambda a: (len(failures[a]), -means[a]))
    return (ranked[0] if found else None), failures


def markdown(found: Sequence[Setting], rows: Sequence[dict[str, Any]], adopted: str | None,
             failures: Mapping[str, list[str]], done: int, total: int,
             machine: Mapping[str, str] | None = None) -> str:
    """The report: per setting the arms' table, then the rule's reading."""
    state = "complete" if done == total else f"INTERIM: {done} of {total} cells finished"
    out = [f"# selection-dev: the rule's reading ({state})", "",
           f"Accuracy (%) is the mean of the last {LAST_K} rounds over the seeds finished, "
           "± the 95% t-interval's half-width; differences are paired by seed. `val` decides "
           "(validation split), `test` is reported. Distinct: share of the 100 clients "
           "selected at least once in the run; top: the most selected client's count over the "
           "mean count (random selection's own top is about 2 in 100 rounds; the posterior "
           "candidates' identity cap holds it near 3).", ""]
    on_device = sorted(k for k, v in (machine or {}).items() if v == "device")
    if machine is not None:
        out += ["Read from the lent accelerator's cells (every cell of the setting finished "
                "there): " + (", ".join(on_device) if on_device else "none") + "; every other "
                "setting from this machine's CPU runs.", ""]
    for s in found:
        peer = s.best_peer()
        out += [f"## {s.name}", "", f"Tuned peers: {s.tuned('power-of-choice')}, "
                f"{s.tuned('oort')}; best peer: **{peer}** (by validation).", "",
                "| arm | n | val | test | val - random | test - random | val - best peer | "
                "test - best peer | distinct | top |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["setting"] == s.name):
            cells = [Interval(r["val"], r["val_half"], r["n"]).text(),
                     Interval(r["test"], r["test_half"], r["n"]).text()]
            for key in ("val_vs_random", "test_vs_random", "val_vs_peer", "test_vs_peer"):
                cells.append(Interval(r[key], r[f"{key}_half"], r["n"]).text(signed=True))
            out.append(f"| {r['arm']} | {r['n']} | " + " | ".join(cells)
                       + f" | {r['distinct']:.2f} | {r['top']:.1f} |")
        out.append("")
    out += ["## The rule", "",
            "Each contender's failures, then its validation accuracy averaged over the "
            "settings (the tie-break: the fewest failures, then the higher mean).", ""]
    means = mean_vals(found)
    for arm in CONTENDERS:
        fails = failures.get(arm, [])
        out.append(f"- {arm} (mean val {means[arm]:.2f}): "
                   + ("eligible" if not fails else "fails: " + "; ".join(fails)))
    word = "adopts" if done == total else "would adopt so far"
    out += ["", f"The rule {word}: **{adopted}**." if adopted else "No finished cells yet.", ""]
    return "\n".join(out)


def plot(found: Sequence[Setting], path: Path) -> None:
    """Validation accuracy per arm with its interval, one panel per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(len(found), 1), figsize=(3.2 * max(len(found), 1), 3.6),
                             squeeze=False)
    for ax, s in zip(axes[0], found, strict=False):
        arms = list(s.scores)
        ivs = [mean_interval(list(s.scores[a].get(VAL, {}).values())) for a in arms]
        ax.errorbar([iv.mean for iv in ivs], range(len(arms)), fmt="o",
                    xerr=[0 if math.isnan(iv.half) else iv.half for iv in ivs])
        ax.set_yticks(range(len(arms)), arms, fontsize=7)
        ax.set_title(s.name, fontsize=8)
        ax.set_xlabel("validation accuracy (%), last 5", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write(preset_path: Path, results: Path, out: Path, device: Path | None = None
          ) -> list[Path]:
    """Read the cells (each setting from one machine: :func:`merge_machines`), apply the
    rule, write the report files."""
    preset = load_preset(preset_path)
    res, machine = merge_machines(preset, load_results(preset, results),
                                  None if device is None else load_results(preset, device))
    found = settings(preset, res)
    rows = arm_rows(found)
    adopted, failures = verdict(found, collapses(preset, res))
    done = sum(r.finished for r in res.values())
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "selection.md", out / "selection-arms.csv", out / "selection-seeds.csv",
             out / "selection-val.png"]
    paths[0].write_text(markdown(found, rows, adopted, failures, done, len(res),
                                 machine if device is not None else None))
    write_csv(paths[1], rows)
    seeds = [{"setting": s.name, "arm": arm, "seed": seed,
              "val": s.scores[arm].get(VAL, {}).get(seed),
              "test": s.scores[arm].get(TEST, {}).get(seed),
              "distinct": s.distinct[arm].get(seed), "top": s.top[arm].get(seed)}
             for s in found for arm in s.scores for seed in sorted(s.distinct[arm])]
    write_csv(paths[2], seeds)
    plot(found, paths[3])
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path)
    p.add_argument("--results", type=Path, required=True, help="the preset's results folder")
    p.add_argument("--out", type=Path, required=True, help="where the report goes")
    p.add_argument("--device-results", type=Path, default=None,
                   help="the cells run on a lent accelerator: a setting all of whose cells "
                        "finished there is read from there")
    args = p.parse_args(argv)
    for path in write(args.preset, args.results, args.out, args.device_results):
        print(f"[selection-dev] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
