"""A run's plots, drawn from its records at the end of every run (and on resume).

``plots/accuracy.png``: test accuracy and loss per round (the central evaluation).
``plots/payouts.png``: the payout ledger, total phi per client with its 95% interval, client
ids on the axis, adversaries in red where ``adversaries.json`` names them (runs that value
clients only).

    python -m server_app.run_plots RUN_DIR     # redraw them for any run dir

Drawing never costs a run: the ServerApp logs a failure and goes on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedowen_strategy.payouts import Payout
from fedowen_strategy.replies import short_label
from server_app.store.payouts import run_payouts
from server_app.store.records import read_rounds

PLOTS_DIR = "plots"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(rounds: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Test accuracy (%) and loss per round, two panels."""
    plt = _pyplot()
    evaluated = [r for r in rounds if r.get("test_accuracy") is not None]
    x = np.array([float(r["round"]) for r in evaluated])
    acc = np.array([100.0 * float(r["test_accuracy"]) for r in evaluated])
    loss = np.array([np.nan if r.get("test_loss") is None else float(r["test_loss"])
                     for r in evaluated])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4), constrained_layout=True)
    a1.plot(x, acc, lw=1.2)
    a1.set(xlabel="round", ylabel="test accuracy (%)", ylim=(0, 100))
    a2.plot(x, loss, lw=1.2, color="tab:orange")
    a2.set(xlabel="round", ylabel="test loss")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    if len(acc):
        a1.set_title(f"last: {acc[-1]:.1f}% after round {x[-1]:.0f}", fontsize=9)
    fig.suptitle(title or "central evaluation", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_payouts(rows: Sequence[Payout], path: Path, title: str = "") -> Path:
    """Total phi per client by rank with its 95% CI whiskers, client ids on the axis;
    adversaries in red; what a forfeited client is paid as a black cross."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.12 * len(rows) + 3), 4.2))
    x = np.arange(len(rows))
    total = np.array([r.total_phi for r in rows])
    lo = np.array([r.total_ci_low for r in rows])
    hi = np.array([r.total_ci_high for r in rows])
    err = np.nan_to_num(np.vstack([total - lo, hi - total]), nan=0.0)
    for flag, color, label in ((False, "tab:blue", "honest"), (True, "tab:red", "adversary"),
                               (None, "tab:gray", "client")):
        pick = np.array([r.adversary is flag for r in rows], dtype=bool)
        if pick.any():
            ax.errorbar(x[pick], total[pick], yerr=err[:, pick], fmt="o", ms=3, capsize=2,
                        color=color, label=label, lw=0.8)
    lost = np.array([r.forfeited for r in rows], dtype=bool)
    if lost.any():  # paid on min(total, 0): caught returning copies
        ax.scatter(x[lost], [r.paid_phi for r, f in zip(rows, lost, strict=True) if f],
                   marker="x", color="black", s=18, lw=0.8, label="paid (forfeited: copies)")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set(xlabel="client id, by paid phi (rank 1 first)",
           ylabel="total phi over the run (95% CI)", title=title or "payout ledger")
    ax.set_xticks(x, [short_label(r.client_id) for r in rows], rotation=90,
                  fontsize=7 if len(rows) <= 40 else 5)
    for tick, row in zip(ax.get_xticklabels(), rows, strict=True):
        if row.adversary:
            tick.set_color("tab:red")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_run(run_dir: Path) -> list[Path]:
    """Draw ``plots/`` of a run dir from its records; the files written."""
    rounds = read_rounds(run_dir)
    if not rounds:
        raise ValueError(f"{run_dir / 'rounds.jsonl'} holds no rounds yet: nothing to draw")
    out = run_dir / PLOTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    files = [plot_curves(rounds, out / "accuracy.png", title=run_dir.name)]
    try:
        rows = run_payouts(run_dir)
    except ValueError:  # a strategy that values nobody has no ledger
        return files
    files.append(plot_payouts(rows, out / "payouts.png", title=f"{run_dir.name}: payouts"))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server_app.run_plots",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run's output dir (with rounds.jsonl)")
    args = parser.parse_args(argv)
    try:
        files = draw_run(args.run_dir)
    except (ValueError, OSError) as err:
        print(f"server_app.run_plots: {err}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
