"""Per-round curves of a backdoor-defaults preset's cells (issue 72, deliver 5), drawn from rows
written beside them: each arm's attack success per round in the attacked cells and its
validation accuracy in the clean ones, mean over seeds, one panel per setting and attack.

:func:`write_curves` writes ``curves.png`` and, beside it, what it draws: ``curves.csv.gz``,
one row a setting, attack, arm, metric (``asr`` or ``val``, %) and round, with the mean over
the seeds that reached it and their count (each cell's own rows are in the preset's archive);
``python -m studies.backdoor.defaults_rule`` calls it beside ``decision.md``. A stalled cell's
rows end where it stopped (the rule carries its last round; the curve does not).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from sim.compact import open_csv, save_png
from sim.results import CellResult

FIELDS = ("dataset", "alpha", "attack", "arm", "metric", "round", "mean", "seeds")
Curves = dict[tuple[tuple[str, float], str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]
METRICS = {"val": "val_accuracy", "asr": "attack_success", "test": "test_accuracy"}


def round_rows(results: Mapping[str, CellResult], attack_of: Callable[[str], str]
               ) -> list[dict[str, Any]]:
    """One row a training round of every cell with rounds (``attack_of(grid)``: the attack a
    grid runs; a cell without attackers is ``clean``), in the preset's order."""
    rows = []
    for result in results.values():
        cfg = result.cell.config
        attack = "clean" if cfg.adversary_fraction == 0 else attack_of(result.cell.grid)
        for r in result.rounds:
            if r.get("round", 0) <= 0:
                continue
            row = {"grid": result.cell.grid, "dataset": cfg.dataset, "alpha": cfg.alpha,
                   "arm": str(result.cell.point.get("variant")), "seed": cfg.seed,
                   "attack": attack, "round": r["round"]}
            for name, key in METRICS.items():
                value = r.get(key)
                row[name] = "" if value is None else round(100 * float(value), 4)
            rows.append(row)
    return rows


def mean_by_round(rows: Sequence[Mapping[str, Any]], metric: str) -> Curves:
    """``{(setting, attack, arm): (rounds, mean over seeds, seeds)}`` of ``metric`` (rounds
    some seed reached; a missing value is left out of its round's mean)."""
    found: dict[tuple[tuple[str, float], str, str], dict[int, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    for r in rows:
        if r[metric] != "":
            found[((r["dataset"], float(r["alpha"])), r["attack"], r["arm"])][
                int(r["round"])].append(float(r[metric]))
    return {key: (np.array(sorted(by)), np.array([np.mean(by[k]) for k in sorted(by)]),
                  np.array([len(by[k]) for k in sorted(by)]))
            for key, by in found.items()}


def drawn(rows: Sequence[Mapping[str, Any]]) -> dict[str, Curves]:
    """What the plot draws: attack success in the attacked cells, validation in the clean."""
    asr = mean_by_round([r for r in rows if r["attack"] != "clean"], "asr")
    return {"asr": asr, "val": mean_by_round([r for r in rows if r["attack"] == "clean"], "val")}


def plot(curves: Mapping[str, Curves], arms: Sequence[str], path: Path) -> Path:
    """One panel per setting (row) and attack (column, ``clean`` last): the attack success per
    round (validation accuracy in ``clean``), one line per arm."""
    asr, val = curves["asr"], curves["val"]
    settings = list(dict.fromkeys(k[0] for k in [*asr, *val]))
    columns = [*dict.fromkeys(k[1] for k in asr), *(["clean"] if val else [])]
    fig, axes = plt.subplots(len(settings), len(columns), squeeze=False, sharex=True,
                             figsize=(2.6 * len(columns), 2.0 * len(settings) + 0.8))
    colours = plt.get_cmap("tab10")
    for i, setting in enumerate(settings):
        for j, attack in enumerate(columns):
            ax = axes[i][j]
            panel = val if attack == "clean" else asr
            for k, arm in enumerate(arms):
                if (setting, attack, arm) in panel:
                    x, y, _ = panel[(setting, attack, arm)]
                    ax.plot(x, y, color=colours(k % 10), lw=1.0, label=arm, antialiased=False)
            if attack != "clean":  # validation keeps its own range: the cost is points
                ax.set_ylim(0, 100)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title("clean: val %" if attack == "clean" else f"{attack}: ASR %",
                             fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{setting[0]} a{setting[1]:g}", fontsize=9)
            if i == len(settings) - 1:
                ax.set_xlabel("round", fontsize=8)
            ax.tick_params(labelsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(arms), 6), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_png(fig, path, dpi=80)
    plt.close(fig)
    return path


def write_curves(results: Mapping[str, CellResult], arms: Sequence[str], out: Path,
                 attack_of: Callable[[str], str]) -> list[Path]:
    """``out/curves.png`` and ``out/curves.csv.gz`` (nothing when no cell has a round)."""
    curves = drawn(round_rows(results, attack_of))
    if not any(curves.values()):
        return []
    out.mkdir(parents=True, exist_ok=True)
    with open_csv(out / "curves.csv.gz", "w") as fh:
        fh.write(",".join(FIELDS) + "\n")
        for metric, by_key in curves.items():
            for ((dataset, alpha), attack, arm), (x, y, n) in by_key.items():
                for k, mean, seeds in zip(x, y, n, strict=True):
                    fh.write(f"{dataset},{alpha},{attack},{arm},{metric},{k},{mean:.2f},"
                             f"{seeds}\n")
    return [out / "curves.csv.gz", plot(curves, arms, out / "curves.png")]
