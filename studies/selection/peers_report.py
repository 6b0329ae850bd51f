"""The selection-peers-dev report's files (:mod:`.peers` reads the cells, :mod:`.peers_rule`
decides): ``selection.md`` (per setting every arm's table, the rule's steps 1-4, leave one seed
out), ``selection-arms.csv`` (one row per setting and arm), ``selection-seeds.csv`` (one row per
finished cell), ``selection-anchor.csv`` (the anchor check seed by seed),
``selection-decisions.json`` (the rule's decisions as data: what the next confirmation's arms
read), and per setting with
cells of this grid ``selection-<setting>-rounds.csv.gz`` (every recorded round of every arm
shown) and ``selection-<setting>-val.png`` (validation accuracy over rounds).

Every name starts with ``selection`` (as selection-dev's reading does): the report folder is
also the grid's own (``sim.experiments report --archive`` writes its README.md, per-grid tables
and archive there as the cells come).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sim.compact import open_csv
from sim.grid import Preset
from sim.results import CellResult
from sim.stats import Interval, mean_interval
from studies.selection.cells import COSTS, TEST, VAL, round_cost, round_costs, write_csv
from studies.selection.peers_data import HEADER_BEST, HERE, THERE, SettingData
from studies.selection.peers_markdown import markdown
from studies.selection.peers_rule import (
    CONTENDERS,
    RANDOM,
    Reading,
    kept,
    leave_one_out,
    read,
)


def slug(name: str) -> str:
    """A setting's name for file names: ``mnist alpha=0.01`` -> ``mnist-alpha0.01``."""
    return name.replace(" alpha=", "-alpha").replace(" ", "-").replace(",", "")


def best_of(d: SettingData, reading: Reading) -> str | None:
    """The setting's best peer when the rule read it."""
    return reading.best.get(d.name)


def mean_costs(results: Mapping[int, CellResult]) -> dict[str, float | None]:
    """Each of :data:`~studies.selection.cells.COSTS` a round, averaged over the finished
    cells that record it."""
    per_cell = [round_costs(r) for r in results.values() if r.finished]
    out: dict[str, float | None] = {}
    for key in COSTS:
        values = [v for c in per_cell if (v := c[key]) is not None]
        out[key] = sum(values) / len(values) if values else None
    return out


def arm_rows(found: Sequence[SettingData], reading: Reading) -> list[dict[str, Any]]:
    """One row per setting and arm shown: accuracies with their intervals, paired differences
    against fedowen-random and the best peer (read settings only; ``_n``: the seeds paired),
    distinct and top shares, costs a round."""
    rows = []
    for d in found:
        s, peer = d.setting, best_of(d, reading)
        for arm in d.results:
            row: dict[str, Any] = {"setting": d.name, "arm": arm, "source": d.sources[arm],
                                   "n": len(s.scores.get(arm, {}).get(VAL, {})),
                                   "best_peer": peer or ""}
            for metric, tag in ((VAL, "val"), (TEST, "test")):
                iv = mean_interval(list(s.scores.get(arm, {}).get(metric, {}).values()))
                row[tag], row[f"{tag}_half"] = iv.mean, iv.half
                for ref, name in ((RANDOM, "random"), (peer, "peer")):
                    diff = s.diff(arm, ref, metric) if ref else Interval(math.nan, math.nan, 0)
                    row[f"{tag}_vs_{name}"], row[f"{tag}_vs_{name}_half"] = diff.mean, diff.half
                    row[f"{tag}_vs_{name}_n"] = diff.n
            row["distinct"] = mean_interval(list(s.distinct.get(arm, {}).values())).mean
            row["top"] = mean_interval(list(s.top.get(arm, {}).values())).mean
            row.update(mean_costs(d.results[arm]))
            rows.append(row)
    return rows


def seed_rows(found: Sequence[SettingData]) -> list[dict[str, Any]]:
    """One row per finished cell shown: its scores, shares and costs a round."""
    rows = []
    for d in found:
        for arm, by_seed in d.results.items():
            for seed, result in sorted(by_seed.items()):
                if not result.finished:
                    continue
                s = d.setting
                rows.append({"setting": d.name, "arm": arm, "source": d.sources[arm],
                             "seed": seed, "cell": result.cell.cell_id,
                             "val": s.scores[arm].get(VAL, {}).get(seed),
                             "test": s.scores[arm].get(TEST, {}).get(seed),
                             "distinct": s.distinct[arm].get(seed),
                             "top": s.top[arm].get(seed), **round_costs(result)})
    return rows


def anchor_rows(found: Sequence[SettingData], there: str = "selection_dev"
                ) -> list[dict[str, Any]]:
    """The anchor check, one row per setting and seed (accuracies as recorded, fractions),
    against ``there`` (the grid reused, as a column name)."""
    rows = []
    for d in found:
        for r in d.anchor.seeds:
            mine, theirs = r["here"] or (None, None), r["there"] or (None, None)
            rows.append({"setting": d.name, "status": d.anchor.status, "seed": r["seed"],
                         "val_here": mine[0], f"val_{there}": theirs[0],
                         "test_here": mine[1], f"test_{there}": theirs[1],
                         "same": "" if r["same"] is None else r["same"],
                         "commits_here": r["commits_here"],
                         f"commits_{there}": r["commits_there"]})
    return rows


def write_rounds(d: SettingData, path: Path) -> Path:
    """Every recorded round of every arm shown: accuracies (%) and costs."""
    fields = ["arm", "source", "seed", "round", "val_accuracy", "test_accuracy", *COSTS]
    with open_csv(path, "w") as fh:
        writer = csv.writer(fh)
        writer.writerow(fields)
        for arm, by_seed in d.results.items():
            for seed, result in sorted(by_seed.items()):
                for r in result.rounds:
                    cost = round_cost(r)
                    writer.writerow([arm, d.sources[arm], seed, r.get("round"),
                                     *(_pct(r.get(k)) for k in (VAL, TEST)),
                                     *("" if cost[k] is None else f"{cost[k]:.4g}"
                                       for k in COSTS)])
    return path


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f}"


def plot(d: SettingData, path: Path, title: str) -> Path:
    """Validation accuracy over rounds, one line per arm (mean over its seeds with records):
    every round, and the second half closer; the contenders thicker, the arms reused from
    selection-dev dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.compact import save_png
    from sim.plots import mean_curve

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), layout="constrained")
    colours = plt.get_cmap("tab20")
    rounds = max(r.total_rounds for by_seed in d.results.values() for r in by_seed.values())
    for i, (arm, by_seed) in enumerate(d.results.items()):
        x, mean, _ = mean_curve(list(by_seed.values()), key=VAL)
        style = {"color": colours(i % 20), "lw": 2.0 if arm in CONTENDERS else 1.1,
                 "ls": "--" if d.sources[arm] == THERE else "-"}
        if len(x):
            axes[0].plot(x, mean, label=f"{arm} (n={len(by_seed)})", **style)
            half = x >= rounds / 2
            axes[1].plot(x[half], mean[half], **style)
    axes[0].set(title="every round", xlabel="round", ylabel="validation accuracy (%)")
    axes[1].set(title="second half", xlabel="round")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right", ncol=2)
    fig.suptitle(f"{title} / {d.name}: validation accuracy (mean over seeds)")
    save_png(fig, path, dpi=90)
    plt.close(fig)
    return path


def decisions_data(found: Sequence[SettingData], reading: Reading,
                   loo: Mapping[str, tuple[str, int]], seeds: int) -> dict[str, Any]:
    """The rule's decisions as data: per setting read, the tuned new peers, the best peer and
    where it comes from (``here`` or ``selection-dev``), each contender's failures; the
    adopted contender (None until every setting is read) and whether it is the fallback; each
    decision with how many of the ``seeds`` leave-one-out readings keep it."""
    sources = {d.name: d.sources for d in found}
    settings = {
        name: {"tuned": tuned, "best_peer": reading.best[name],
               "best_peer_from": sources[name].get(reading.best[name], THERE),
               "contenders": {arm: [f.text() for f in reading.failures[arm]
                                    if f.setting == name] for arm in CONTENDERS}}
        for name, tuned in reading.tuned.items()}
    return {"settings_read": list(settings), "settings_total": len(found),
            "settings": settings, "adopted": reading.adopted, "fallback": reading.fallback,
            "mean_val": {arm: (v if math.isfinite(v) else None)
                         for arm, v in reading.means.items()},
            "kept": {k: {"decision": v, "kept": n, "of": seeds} for k, (v, n) in loo.items()}}


def write(preset: Preset, found: Sequence[SettingData], res: Mapping[str, CellResult],
          out: Path, command: str, aside: Sequence[str] = ()) -> list[Path]:
    """Apply the rule to the read settings and write the report's files into ``out``
    (``aside``: the ids of the cells set aside, read as missing)."""
    decided = [d for d in found if d.decided]
    reference = {d.name: d.reference_peer or "" for d in decided}
    reading = read([d.setting for d in decided], reference, total=len(found))
    seeds = sorted({s for d in decided for s in d.seeds})
    loo = kept(reading, leave_one_out([d.setting for d in decided], reference, seeds,
                                      total=len(found)))
    done = sum(r.finished for r in res.values())
    out.mkdir(parents=True, exist_ok=True)
    rows = arm_rows(found, reading)
    paths = [out / "selection.md", out / "selection-arms.csv", out / "selection-seeds.csv",
             out / "selection-anchor.csv", out / "selection-decisions.json"]
    paths[0].write_text(markdown(preset, found, rows, reading, loo, len(seeds), done,
                                 len(res), command, HEADER_BEST, aside))
    write_csv(paths[1], rows)
    write_csv(paths[2], seed_rows(found))
    write_csv(paths[3], anchor_rows(found))
    paths[4].write_text(json.dumps(decisions_data(found, reading, loo, len(seeds)), indent=1)
                        + "\n")
    for d in found:
        if any(d.sources[a] == HERE for a in d.results if d.results[a]):
            paths.append(write_rounds(d, out / f"selection-{slug(d.name)}-rounds.csv.gz"))
            paths.append(plot(d, out / f"selection-{slug(d.name)}-val.png", preset.name))
    return paths
