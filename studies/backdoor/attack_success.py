"""Backdoor reports (issue 45): attack success per arm, and the development rule's reading.

For every finished attacked cell of a backdoor preset: its attack success rate ("ASR":
stamped test images of other classes classified as the target; the maximum over the last 5
rounds), its validation and test accuracy (mean of the last 5 rounds); for every clean cell
its accuracies. Then, per dataset, each arm's ASR by seed and its clean validation accuracy
paired against the reference arm's clean runs. The development presets' rule
(conf/backdoor-dev.toml): a candidate (an arm named ``<reference>-...``) holds when its ASR is
<= 5% in every seed of every dataset and the lower bound of its paired clean cost is >= -2
points in every dataset; of those, the one of the higher mean clean validation accuracy goes
on. Test accuracy is reported, never used.

    python -m studies.backdoor.attack_success conf/backdoor-dev.toml --results RESULTS \\
        --out DIR [--reference fedowen]

writes ``attack-success.md``, ``attack-success-cells.csv`` (one row per finished cell),
``attack-success-rounds.csv.gz`` (ASR and test accuracy per round of every attacked cell) and
``attack-success.png`` (ASR per round, mean over seeds, one panel per attack grid and dataset).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sim.compact import open_csv, save_png
from sim.grid import Preset
from sim.presets import load_preset
from sim.results import LAST_K, CellResult, load_results
from sim.sections import Part
from sim.stats import Interval, mean_interval, paired_interval
from studies.adversarial.attack_costs import attack_name, attacked

ASR_BAR, COST_BAR = 5.0, -2.0


def asr_curve(result: CellResult) -> tuple[np.ndarray, np.ndarray]:
    """(round, attack success in %) of every round that measured it."""
    pts = [(r["round"], 100.0 * r["attack_success"]) for r in result.rounds
           if r.get("attack_success") is not None]
    arr = np.array(pts, dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def cell_rows(res: Mapping[str, CellResult]) -> list[dict[str, Any]]:
    """One row per finished cell: grid, dataset, arm, seed, attack, ASR (max of the last 5
    rounds; attacked cells), validation and test accuracy (mean of the last 5)."""
    rows = []
    for r in res.values():
        if not r.finished:
            continue
        cfg, point = r.cell.run_config, r.cell.point
        hit = attacked(cfg)
        rounds, asr = asr_curve(r)
        rows.append({
            "grid": r.cell.grid, "dataset": r.cell.config.dataset,
            "arm": str(point.get("variant", r.cell.config.strategy)), "seed": r.cell.config.seed,
            "attack": attack_name(cfg) if hit else "none",
            "asr": float(asr[rounds > 0][-LAST_K:].max()) if hit and asr.size else math.nan,
            "val": r.last_k_accuracy(key="val_accuracy"), "test": r.last_k_accuracy(),
            "cell": r.cell.cell_id})
    return sorted(rows, key=lambda x: (x["grid"], x["dataset"], x["arm"], x["seed"]))


def _by_seed(rows: Sequence[dict[str, Any]], metric: str, **where: Any) -> dict[int, float]:
    return {x["seed"]: x[metric] for x in rows
            if all(x[k] == v for k, v in where.items()) and x[metric] is not None}


def verdict(rows: Sequence[dict[str, Any]], reference: str
            ) -> tuple[str | None, dict[str, list[str]]]:
    """The development rule: the candidate that goes on (or None) and, per candidate, how it
    failed (empty: it holds)."""
    datasets = sorted({x["dataset"] for x in rows})
    candidates = sorted({x["arm"] for x in rows if x["arm"].startswith(f"{reference}-")})
    failures: dict[str, list[str]] = {}
    clean_val: dict[str, float] = {}
    for arm in candidates:
        fails = []
        for ds in datasets:
            asr = [x for x in rows if x["arm"] == arm and x["dataset"] == ds
                   and x["attack"] != "none"]
            high = [f"seed {x['seed']} {x['asr']:.1f}%" for x in asr if not x["asr"] <= ASR_BAR]
            if high:
                fails.append(f"{ds} ASR above {ASR_BAR:g}%: " + ", ".join(high))
            cost = clean_cost(rows, arm, reference, ds)
            if not (cost.n > 1 and cost.lo >= COST_BAR):
                fails.append(f"{ds} clean cost {cost.text(signed=True)} (lower bound below "
                             f"{COST_BAR:g})")
        failures[arm] = fails
        vals = [x["val"] for x in rows if x["arm"] == arm and x["attack"] == "none"]
        clean_val[arm] = float(np.mean(vals)) if vals else -math.inf
    holding = [arm for arm in candidates if not failures[arm]]
    return (max(holding, key=clean_val.__getitem__) if holding else None), failures


def clean_cost(rows: Sequence[dict[str, Any]], arm: str, reference: str, dataset: str,
               metric: str = "val") -> Interval:
    """``arm``'s clean accuracy minus ``reference``'s, paired by seed."""
    return paired_interval(_by_seed(rows, metric, arm=arm, dataset=dataset, attack="none"),
                           _by_seed(rows, metric, arm=reference, dataset=dataset, attack="none"))


def markdown(title: str, rows: Sequence[dict[str, Any]], reference: str,
             adopted: str | None, failures: Mapping[str, list[str]], done: int,
             total: int) -> str:
    state = "complete" if done == total else f"INTERIM: {done} of {total} cells finished"
    out = [f"# {title}: attack success and clean cost ({state})", "",
           f"ASR: attack success rate (%), the maximum over the last {LAST_K} rounds, per seed. "
           f"Accuracy (%): mean of the last {LAST_K} rounds ± the 95% t-interval's half-width. "
           f"Clean cost: the arm's clean accuracy minus {reference}'s clean accuracy, paired "
           "by seed (validation decides, test is reported).", ""]
    attacks = sorted({(x["grid"], x["attack"]) for x in rows if x["attack"] != "none"})
    for ds in sorted({x["dataset"] for x in rows}):
        out += [f"## {ds}", "", "| attack | arm | ASR by seed | ASR <= 5% | val | test | "
                "clean val | clean cost (val) | clean cost (test) |",
                "|---|---|---|---|---|---|---|---|---|"]
        for grid, attack in attacks:
            for arm in sorted({x["arm"] for x in rows if x["grid"] == grid}):
                hit = [x for x in rows if (x["grid"], x["arm"], x["dataset"]) == (grid, arm, ds)]
                if not hit:
                    continue
                asr = ", ".join(f"{x['asr']:.1f}" for x in hit)
                ok = "yes" if all(x["asr"] <= ASR_BAR for x in hit) else "no"
                clean = [x["val"] for x in rows if (x["arm"], x["dataset"], x["attack"])
                         == (arm, ds, "none")]
                out.append(
                    f"| {attack} | {arm} | {asr} | {ok} | "
                    f"{mean_interval([x['val'] for x in hit]).text()} | "
                    f"{mean_interval([x['test'] for x in hit]).text()} | "
                    f"{mean_interval(clean).text()} | "
                    f"{clean_cost(rows, arm, reference, ds).text(signed=True)} | "
                    f"{clean_cost(rows, arm, reference, ds, 'test').text(signed=True)} |")
        out.append("")
    if failures:
        out += ["## The development rule", ""]
        out += [f"- {arm}: " + ("holds" if not fails else "fails: " + "; ".join(fails))
                for arm, fails in failures.items()]
        word = "goes on" if done == total else "would go on so far"
        out += ["", f"Candidate that {word}: **{adopted}**." if adopted
                else f"No candidate {word}.", ""]
    return "\n".join(out)


def round_rows(res: Mapping[str, CellResult]) -> list[dict[str, Any]]:
    """ASR and test accuracy per round of every finished attacked cell."""
    rows = []
    for r in res.values():
        if not (r.finished and attacked(r.cell.run_config)):
            continue
        rounds, asr = asr_curve(r)
        acc = dict(zip(*r.curve(), strict=True))
        rows += [{"grid": r.cell.grid, "dataset": r.cell.config.dataset,
                  "arm": str(r.cell.point.get("variant", r.cell.config.strategy)),
                  "seed": r.cell.config.seed, "round": int(n), "asr": round(float(a), 2),
                  "test_accuracy": round(float(acc.get(n, math.nan)), 2)}
                 for n, a in zip(rounds, asr, strict=True)]
    return rows


def plot(rounds: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """ASR per round (mean over seeds), one line per arm, one panel per grid and dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[tuple[str, str], dict[str, dict[int, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for x in rounds:
        curves[(x["grid"], x["dataset"])][x["arm"]][x["round"]].append(x["asr"])
    if not curves:
        return None
    panels = sorted(curves)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.0), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for arm, by_round in sorted(curves[panel].items()):
            xs = sorted(by_round)
            ax.plot(xs, [np.mean(by_round[n]) for n in xs], label=arm, lw=1)
        ax.axhline(ASR_BAR, color="grey", lw=0.6, ls="--")
        ax.set_title(" ".join(panel), fontsize=7)
        ax.set_xlabel("round", fontsize=7)
        ax.set_ylabel("attack success (%)", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0][0].legend(fontsize=5)
    fig.tight_layout()
    save_png(fig, path, dpi=90)
    plt.close(fig)
    return path


def measured(res: Mapping[str, CellResult]) -> bool:
    """Whether any finished cell recorded attack success (a backdoor ran)."""
    return any(r.finished and any(x.get("attack_success") is not None for x in r.rounds)
               for r in res.values())


def attack_success_section(preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    """The report's section after the grids where a backdoor ran (empty otherwise): the
    attack-success files against the first grid's ``reference`` (default ``fedowen``)."""
    if not measured(res):
        return Part([])
    reference = next((g.reference for g in preset.grids if g.reference), "fedowen")
    files = write_cells(preset, res, out, reference)
    return Part(["## Attack success", "", "Backdoor cells: attack success per seed and clean "
                 f"cost against `{reference}` in [attack-success.md](attack-success.md) "
                 "(`python -m studies.backdoor.attack_success`).", ""], files=files)


def write(preset_path: Path, results: Path, out: Path, reference: str) -> list[Path]:
    """Read the cells, apply the rule, write the report files."""
    preset = load_preset(preset_path)
    return write_cells(preset, load_results(preset, results), out, reference)


def write_cells(preset: Preset, res: Mapping[str, CellResult], out: Path,
                reference: str) -> list[Path]:
    """The report files of ``res``, ``preset``'s loaded cells."""
    rows = cell_rows(res)
    adopted, failures = verdict(rows, reference)
    done = sum(r.finished for r in res.values())
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "attack-success.md", out / "attack-success-cells.csv",
             out / "attack-success-rounds.csv.gz"]
    paths[0].write_text(markdown(preset.name, rows, reference, adopted, failures, done,
                                 len(preset.cells())))
    rounds = round_rows(res)
    for path, table in ((paths[1], rows), (paths[2], rounds)):
        with open_csv(path, "w") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(table[0]) if table else ["grid"])
            writer.writeheader()
            writer.writerows(table)
    png = plot(rounds, out / "attack-success.png")
    return paths + ([png] if png else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path)
    p.add_argument("--results", type=Path, required=True, help="the preset's results folder")
    p.add_argument("--out", type=Path, required=True, help="where the report goes")
    p.add_argument("--reference", default="fedowen",
                   help="the arm clean costs are paired against; arms named <reference>-... "
                        "are the rule's candidates")
    args = p.parse_args(argv)
    for path in write(args.preset, args.results, args.out, args.reference):
        print(f"[backdoor] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
