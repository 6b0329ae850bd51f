"""What a run leaves at its end: ``final_model.pt``, ``summary.json``, ``payouts.csv`` (runs
that value clients), ``plots/`` and the summary lines of its log."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord

from fedowen_strategy.payouts import Payout
from server_app.config import RunConfig
from server_app.factory import strategy_label
from server_app.progress import summary_lines
from server_app.store.payouts import PAYOUTS_FILE, run_payouts, write_payouts
from server_app.store.records import RunRecorder, read_rounds

log = logging.getLogger(__name__)
FINAL_MODEL = "final_model.pt"
SUMMARY_FILE = "summary.json"


def finish(cfg: RunConfig, recorder: RunRecorder, final: ArrayRecord, done: int,
           seconds: float) -> dict[str, Any]:
    """Save the final model, the summary, the payouts and the plots; log the summary lines;
    return the summary. ``final`` is the last evaluated model: Flower's ``Result.arrays``
    stays empty when no round aggregated."""
    out_dir = recorder.output_dir
    torch.save(final.to_torch_state_dict(), out_dir / FINAL_MODEL)
    summary = run_summary(cfg, out_dir, done, seconds)
    recorder.write_json(SUMMARY_FILE, summary)
    payouts = _write_payouts(out_dir)
    _draw(out_dir)
    for line in summary_lines(strategy_label(cfg), summary, read_rounds(out_dir), out_dir,
                              payouts):
        log.info("%s", line)
    return summary


def run_summary(cfg: RunConfig, out_dir: Path, done: int, seconds: float) -> dict[str, Any]:
    """summary.json's content, from the run's records."""
    rounds = read_rounds(out_dir)
    last = next((r for r in rounds if r["round"] == cfg.num_server_rounds), None)
    acc = last.get("test_accuracy") if last else None
    aggregated = sum(1 for r in rounds if r.get("returned"))
    summary = {"rounds": cfg.num_server_rounds, "strategy": cfg.strategy,
               "valuation": cfg.valuation, "model": cfg.model_name(),
               # the local-training recipe the clients trained with (the model's, under the keys)
               "recipe": asdict(cfg.train_config()), "resumed_after_round": done,
               "aggregated_rounds": aggregated,
               "final_test_accuracy": acc if isinstance(acc, float) else None,
               "seconds": seconds, "output_dir": str(out_dir)}
    if aggregated == 0:
        summary["warning"] = ("no round aggregated any update (every reply failed or was "
                              "rejected; see rounds.jsonl): final_model.pt is the initial model")
        log.warning("%s", summary["warning"])
    return summary


def already_finished(cfg: RunConfig, recorder: RunRecorder, model: torch.nn.Module, done: int
                     ) -> dict[str, Any]:
    """A resume of a run whose checkpoint is at or past ``num-server-rounds``: run nothing,
    keep ``final_model.pt`` (write the checkpoint's model only where it is missing)."""
    out_dir = recorder.output_dir
    log.info("The run in %s already finished round %d of %d: nothing to resume; its final "
             "model and records are kept", out_dir, done, cfg.num_server_rounds)
    if not (out_dir / FINAL_MODEL).exists():
        torch.save(model.state_dict(), out_dir / FINAL_MODEL)
    summary_file = out_dir / SUMMARY_FILE
    if summary_file.exists():
        return dict(json.loads(summary_file.read_text()), already_finished=True)
    summary = run_summary(cfg, out_dir, done, 0.0)
    recorder.write_json(SUMMARY_FILE, summary)
    return dict(summary, already_finished=True)


def _write_payouts(out_dir: Path) -> list[Payout]:
    """The payout ledger (``payouts.csv``) of a run that valued clients; others have none."""
    try:
        rows = run_payouts(out_dir)
    except ValueError:
        return []
    write_payouts(rows, out_dir / PAYOUTS_FILE)
    return rows


def _draw(out_dir: Path) -> None:
    """``plots/`` of the run (server_app.run_plots); a failure to draw costs nothing else."""
    from server_app.run_plots import draw_run  # matplotlib only once the rounds are done

    try:
        files = draw_run(out_dir)
    except Exception as err:  # a plot must never fail a finished run
        log.warning("plots not drawn (%s: %s); redraw with python -m server_app.run_plots %s",
                    type(err).__name__, err, out_dir)
        return
    log.info("plots: %s (redraw: python -m server_app.run_plots %s)",
             ", ".join(str(f) for f in files), out_dir)
