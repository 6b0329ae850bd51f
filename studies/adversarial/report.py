"""Report of ``adversarial`` grids: accuracy under attack, and how FedOwen treats adversaries.

From the statistics of :mod:`studies.adversarial.adversary_stats`, per FedOwen cell we report

- the adversaries' mean *rank percentile* of phi within their round (0 = highest phi of the
  round, 1 = lowest) beside the honest clients' (0.5 = indistinguishable);
- the share of each round's participants that are adversaries, against the base rate
  ``adversary-fraction`` (what uniform selection would give), overall and over the second half
  of the rounds (after the bandit has contribution history);
- the share of the aggregation weight the adversaries got;
- the payout ledger over the run (:mod:`fedowen_strategy.payouts`, with its forfeit of
  identities caught returning copies): the adversaries' and honest clients' mean paid phi per
  client, their mean rank percentile in the ledger, and the adversaries' share of the pool.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fedowen_strategy.round.round_valuers import NO_PHI
from fedowen_task.config import TaskConfig
from sim.compact import open_csv, save_png
from sim.grid import Preset, app_config, expand_grid
from sim.results import CellResult, Stat, markdown_table
from sim.sections import Part
from studies.adversarial.adversary_stats import (
    SERIES_KEYS,
    cell_series,
    ledger_stats,
    moving_average,
)

COLS = ("adversary-kind", "adversary-fraction")
DEFAULTS = {"adversary-kind": TaskConfig.adversary_kind,
            "adversary-fraction": TaskConfig.adversary_fraction}


def _cols(cfg: dict[str, Any], extra: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """The cell's column: adversary kind and fraction, then the grids' other axes (e.g. alpha)."""
    return (*(cfg.get(c, DEFAULTS[c]) for c in COLS), *(cfg.get(k) for k in extra))


def _extra_axes(grids: list[Any], row_key: str) -> tuple[str, ...]:
    """Axes of the grids besides seed, the rows and :data:`COLS` (each a column key)."""
    return tuple(dict.fromkeys(k for g in grids for k in g.axes
                               if k not in ("seed", row_key, *COLS)))


def _values_phi(cfg: dict[str, Any]) -> bool:
    """Whether the cell's phi is a contribution estimate (not FedAvg's, Multi-Krum's or a peer
    strategy's placeholder)."""
    app = app_config(cfg)
    return app.strategy == "fedowen" and app.valuation not in NO_PHI


def _head(row_key: str, col_keys: tuple[str, ...], names: tuple[str, ...]) -> list[str]:
    """A markdown table's header and separator lines."""
    heads = (row_key, *col_keys, *names)
    return ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]


def _nanmean(x: np.ndarray) -> float:
    return float(np.nanmean(x)) if np.isfinite(x).any() else math.nan


def _row(result: CellResult, key: str) -> str:
    """The cell's row value: a grid-point value (e.g. a variant name), else its run config's."""
    return str(result.cell.point.get(key, result.cell.run_config.get(key)))


SHARE_INTRO = ("How each method treats the adversaries (all recorded rounds of finished and "
               "unfinished cells; rank percentile of phi within the round: 0 = top, 1 = bottom, "
               "0.5 = no signal; share = adversaries among the round's participants):")
SHARE_HEADS = ("base rate", "selected share (all / 2nd half)", "weight share",
               "adversary phi rank", "honest phi rank", "adversary mean phi", "honest mean phi",
               "rounds")
LEDGER_INTRO = ("The payout ledger over each run (`python -m sim.ledger RUN_DIR`; mean over "
                "seeds): mean paid phi per client (identities caught returning copies are "
                "paid on min(total, 0)), mean rank percentile in the ledger (0 = top, 1 = "
                "bottom), the adversaries' share of the payout pool (their share of the "
                "valued clients in brackets), an adversary's mean payout over an honest "
                "client's (at most 1: paid no more than an honest client), and clients "
                "forfeited per run:")
LEDGER_HEADS = ("adversary paid phi", "honest paid phi", "adversary ledger rank",
                "honest ledger rank", "adversaries' pool share",
                "payout per adversary / per honest client", "forfeited adversaries / honest",
                "seeds")
PHI_KEYS = ("adv_rank", "honest_rank", "adv_phi", "honest_phi")
Groups = dict[tuple[Any, ...], list[CellResult]]
Series = dict[str, dict[str, np.ndarray]]  # cell id -> its cell_series


def adversarial_section(preset: Preset, res: dict[str, CellResult], out: Path) -> Part:
    """Markdown lines, CSV rows and the selection-share plot of all adversarial grids (rows:
    the grids' ``rows`` key, e.g. ``valuation`` or ``variant``); empty without one."""
    grids = [g for g in preset.grids if g.kind == "adversarial"]
    if not grids:
        return Part([])
    row_key = grids[0].rows
    extra = _extra_axes(grids, row_key)
    col_keys = (*COLS, *extra)
    cells = list({c.cell_id: res[c.cell_id] for g in grids
                  for c in expand_grid(preset, g)}.values())
    rows = list(dict.fromkeys(_row(r, row_key) for r in cells))
    cols = [dict(zip(col_keys, k, strict=True)) for k in dict.fromkeys(
        _cols(r.cell.run_config, extra) for r in cells)]
    groups, no_phi = _group_cells(cells, row_key, extra)
    series = {r.cell.cell_id: cell_series(r, preset.num_supernodes) for r in cells}
    stats = _accuracy_stats(groups, rows, cols)
    done = sum(r.finished for r in cells)
    md = ["## Adversarial clients", "",
          f"Cells finished: {done} of {len(cells)}. Final test accuracy (%), mean ± std over "
          "seeds; best per column in bold.", "", markdown_table(stats, rows, cols, row_key),
          "", SHARE_INTRO, "", *_head(row_key, col_keys, SHARE_HEADS)]
    csv_rows: list[dict[str, Any]] = []
    ledger_md = ["", LEDGER_INTRO, "", *_head(row_key, col_keys, LEDGER_HEADS)]
    for key, members in groups.items():
        row = _share_row(members, series, phi=key[0] not in no_phi)
        if row is None:
            continue
        md.append(_share_line(key, row))
        if key[0] not in no_phi:
            ledgers = [ledger_stats(m, preset.num_supernodes) for m in members if m.rounds]
            ledgers = [led for led in ledgers if led]
            if ledgers:
                row.update({k: float(np.nanmean([led[k] for led in ledgers]))
                            for k in ledgers[0]})
                ledger_md.append(_ledger_line(key, row, len(ledgers)))
        row.pop("rounds")
        csv_rows.append(_csv_row(key, stats[key], row, row_key, col_keys))
    pngs = [plot_selection_share(groups, series, cols, out / f"{name}.png", what=what)
            for name, what in (("selection-share", "share"), ("weight-share", "weight_share"))]
    per_round = write_adversary_rounds(groups, series, col_keys, row_key,
                                       out / "adversary-rounds.csv.gz")
    if len(ledger_md) > 5:
        md += ledger_md
    md += ["", "Phi ranks only for contribution-valuing methods (FedAvg, Multi-Krum, FLTrust and "
           "FoolsGold value nobody); the weight share is the adversaries' part of the aggregate.",
           "", *(f"![{p.stem}]({p.name})" for p in pngs), "",
           f"Per-round data (adversaries' share of participants and of weight, phi ranks): "
           f"[{per_round.name}]({per_round.name}).", ""]
    return Part(md, csv_rows, [*pngs, per_round])


def _group_cells(cells: list[CellResult], row_key: str,
                 extra: tuple[str, ...]) -> tuple[Groups, set[str]]:
    """Cells by (row, column values), and the rows whose phi is no contribution estimate."""
    groups: Groups = {}
    no_phi: set[str] = set()
    for r in cells:
        cfg = r.cell.run_config
        groups.setdefault((_row(r, row_key), *_cols(cfg, extra)), []).append(r)
        if not _values_phi(cfg):
            no_phi.add(_row(r, row_key))
    return groups, no_phi


def _accuracy_stats(groups: Groups, rows: list[str],
                    cols: list[dict[str, Any]]) -> dict[tuple[Any, ...], Stat]:
    """Final accuracy per (row, column), absent combinations empty."""
    stats = {}
    for key, members in groups.items():
        vals = tuple(v for v in (m.final_accuracy() for m in members) if v is not None)
        stats[key] = Stat(vals, len(members))
    for name in rows:
        for c in cols:
            stats.setdefault((name, *c.values()), Stat((), 0))
    return stats


def _share_row(members: list[CellResult], series: Series,
               phi: bool) -> dict[str, float] | None:
    """The group's mean adversary shares and phi ranks over all recorded rounds (phi keys NaN
    where phi is a placeholder, not a contribution estimate); None before any round."""
    found = [series[m.cell.cell_id] for m in members if m.rounds]
    if not found:
        return None
    cat = {k: np.concatenate([s[k] for s in found]) for k in found[0]}
    half = np.concatenate([s["share"][len(s["share"]) // 2:] for s in found])
    row = {"share": _nanmean(cat["share"]), "share_2nd_half": _nanmean(half),
           "weight_share": _nanmean(cat["weight_share"]),
           **{k: _nanmean(cat[k]) if phi else math.nan for k in PHI_KEYS},
           "rounds": len(cat["round"])}
    return row


def _share_line(key: tuple[Any, ...], row: dict[str, float]) -> str:
    ranks = ("- | - | - | -" if math.isnan(row["adv_rank"]) else
             f"{row['adv_rank']:.3f} | {row['honest_rank']:.3f} | {row['adv_phi']:+.4f} | "
             f"{row['honest_phi']:+.4f}")
    return (f"| {key[0]} | " + " | ".join(str(v) for v in key[1:]) +
            f" | {float(key[2]):.2f} | {row['share']:.3f} / {row['share_2nd_half']:.3f} | "
            f"{row['weight_share']:.3f} | {ranks} | {row['rounds']} |")


def _ledger_line(key: tuple[Any, ...], row: dict[str, float], seeds: int) -> str:
    return (f"| {key[0]} | " + " | ".join(str(v) for v in key[1:]) +
            f" | {row['ledger_adv_paid']:+.3f} | {row['ledger_honest_paid']:+.3f} | "
            f"{row['ledger_adv_rank']:.3f} | {row['ledger_honest_rank']:.3f} | "
            f"{row['ledger_adv_pool']:.3f} ({row['ledger_adv_clients']:.2f}) | "
            f"{row['ledger_payout_ratio']:.2f} | "
            f"{row['ledger_adv_forfeited']:.1f} / {row['ledger_honest_forfeited']:.1f} | "
            f"{seeds} |")


def _csv_row(key: tuple[Any, ...], st: Stat, row: dict[str, float], row_key: str,
             col_keys: tuple[str, ...]) -> dict[str, Any]:
    return {"grid": "adversarial", "metric": "final", "row_key": row_key, "row": key[0],
            "columns": ", ".join(f"{k}={v}" for k, v in zip(col_keys, key[1:], strict=True)),
            "n": st.n, "expected": st.expected, "mean": "" if not st.n else round(st.mean, 4),
            "std": "" if math.isnan(st.std) else round(st.std, 4),
            "values": " ".join(f"{v:.2f}" for v in st.values), "paper": "",
            **{k: round(v, 4) for k, v in row.items()}}


def write_adversary_rounds(groups: Groups, series: Series, col_keys: tuple[str, ...],
                           row_key: str, path: Path) -> Path:
    """Every cell's per-round :func:`round_stats` (the data behind the share plots)."""
    keys = SERIES_KEYS
    with open_csv(path, "w") as fh:
        writer = csv.writer(fh)
        writer.writerow([row_key, *col_keys, "seed", "round", *keys])
        for key, members in groups.items():
            for m in members:
                cell = series[m.cell.cell_id]
                for i, rnd in enumerate(cell["round"]):
                    writer.writerow([*key, m.cell.config.seed, int(rnd),
                                     *("" if not np.isfinite(cell[k][i]) else
                                       round(float(cell[k][i]), 4) for k in keys)])
    return path


def plot_selection_share(groups: Groups, series: Series, cols: list[dict[str, Any]], path: Path,
                         smooth: int = 5, what: str = "share") -> Path:
    """Adversaries' share of each round's participants (``what="share"``) or of its
    aggregation weight (``"weight_share"``), mean over seeds, ``smooth``-round moving average,
    per method, one panel per column (kind, fraction, other axes), base rate dashed."""
    ncol = min(max(len(cols), 1), 2)
    nrow = math.ceil(max(len(cols), 1) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6 * ncol, 4.2 * nrow), squeeze=False)
    for ax in axes.flat[len(cols):]:
        ax.set_visible(False)
    for ax, col in zip(axes.flat, cols, strict=False):
        for key, members in groups.items():
            if list(key[1:]) != list(col.values()):
                continue
            found = [series[m.cell.cell_id] for m in members if len(m.rounds) > 1]
            if not found:
                continue
            n = min(len(s["share"]) for s in found)
            share = np.nanmean(np.stack([s[what][:n] for s in found]), axis=0)
            ax.plot(found[0]["round"][:n], moving_average(share, smooth),
                    label=f"{key[0]} ({len(found)} seed{'s' * (len(found) > 1)})",
                    lw=2.2 if key[0] in ("owen", "fedowen") else 1.2)
        ax.axhline(float(col["adversary-fraction"]), ls="--", color="gray", label="base rate")
        ax.set(title=", ".join(f"{k}={v}" for k, v in col.items()), xlabel="round",
               ylabel=(f"adversaries among participants ({smooth}-round mean)"
                       if what == "share" else
                       f"adversaries' share of the weight ({smooth}-round mean)"), ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path
