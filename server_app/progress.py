"""What a run says while it runs: one line per round, a one-screen summary at the end.

Flower's strategy loop logs a banner per round, the aggregated metric records (FedOwen's hold
every client's phi and weight: lines of about 1,000 characters) and, at the end, every
round's metrics again: thousands of lines for a 100-round run, none of which says when the
run will end. Unless ``verbose = true``, :func:`quiet` lets Flower's handlers pass only
warnings, errors and the lines of :class:`Progress` while the rounds run; everything per
client stays in the run's files (``rounds.jsonl``, ``ledger.csv``, ``payouts.csv``).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flwr.common.logger import FLOWER_LOGGER

from fedowen_strategy.replies import short_label

#: ``extra`` that marks a log record as a progress line (passes :class:`QuietFilter`).
PROGRESS = {"progress": True}


class Unactionable(logging.Filter):
    """Drops Flower's warnings about settings this app makes on purpose (federated
    evaluation is off: the ServerApp evaluates centrally)."""

    MESSAGES = ("fraction_evaluate is set to 0.0",)

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.MESSAGES)


#: Library warnings nobody running the app can act on, as (category, module that warns):
#: Ray's start-up tip about a future default (GPUs visible to actors that asked for none),
#: raised when the simulation engine first starts Ray, after the ServerApp is up. The switch
#: it names would change that behaviour now.
UNACTIONABLE_WARNINGS = ((FutureWarning, r"ray\._private\.worker"),)


class RoundBanner(logging.Filter):
    """Numbers Flower's ``[ROUND r/R]`` banner globally after a resume: ``strategy.start``
    counts the rounds of this invocation only (round 35 of 100 after 34 read ``1/66``)."""

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset

    def filter(self, record: logging.LogRecord) -> bool:
        if self.offset and record.msg == "[ROUND %s/%s]" and isinstance(record.args, tuple):
            record.args = tuple(a + self.offset if isinstance(a, int) else a
                                for a in record.args)
        return True


@contextmanager
def round_banner(offset: int) -> Iterator[None]:
    """While the block runs, Flower's round banner counts ``offset`` rounds done before."""
    banner = RoundBanner(offset)
    FLOWER_LOGGER.addFilter(banner)
    try:
        yield
    finally:
        FLOWER_LOGGER.removeFilter(banner)


class QuietFilter(logging.Filter):
    """Warnings, errors and progress lines pass; other INFO and DEBUG records do not."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or bool(getattr(record, "progress", False))


@contextmanager
def quiet(verbose: bool) -> Iterator[None]:
    """While the block runs (the rounds), Flower's handlers, which the app's and library's
    loggers share, pass only what :class:`QuietFilter` lets through; ``verbose``: all."""
    if verbose:
        yield
        return
    for category, module in UNACTIONABLE_WARNINGS:  # for the process: Ray starts once
        warnings.filterwarnings("ignore", category=category, module=module)
    quiet_filter = QuietFilter()
    # the root's too: a process that also configured logging (sim.inline) prints records
    # that propagate from Flower's logger a second time
    handlers = [*FLOWER_LOGGER.handlers, *logging.getLogger().handlers]
    for handler in handlers:
        handler.addFilter(quiet_filter)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet_filter)


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """The per-round line, with an ETA from the mean time of this invocation's rounds."""

    def __init__(self, total: int, done: int = 0) -> None:
        self.total, self.done = total, done
        self.started = time.perf_counter()

    def line(self, server_round: int, record: Mapping[str, Any]) -> str:
        """``round 35/100: test accuracy 93.12%, loss 0.2310 | 10 selected, 10 returned |
        valuation 0.84s | round 2.1s | ETA 2m16s``."""
        parts = [f"round {server_round}/{self.total}: " + (
            f"test accuracy {100 * float(record['test_accuracy']):.2f}%, loss "
            f"{float(record.get('test_loss', math.nan)):.4f}"
            if record.get("test_accuracy") is not None else "not evaluated (eval-every)")]
        if server_round == 0:
            return parts[0] + " (the initial model)"
        counts = [f"{len(record[k])} {k}" for k in ("selected", "returned", "failed",
                                                     "rejected") if record.get(k)]
        if counts:
            parts.append(", ".join(counts))
        if record.get("valuation_seconds") is not None:
            parts.append(f"valuation {float(record['valuation_seconds']):.2f}s")
        if record.get("round_seconds") is not None:
            parts.append(f"round {float(record['round_seconds']):.1f}s")
        ran = server_round - self.done
        if ran > 0:
            per_round = (time.perf_counter() - self.started) / ran
            parts.append(f"ETA {duration(per_round * (self.total - server_round))}")
        return " | ".join(parts)


def summary_lines(name: str, summary: Mapping[str, Any], rounds: Sequence[Mapping[str, Any]],
                  out_dir: Path, payouts: Sequence[Any] = ()) -> list[str]:
    """The end of a run on one screen: accuracy, time, where everything is."""
    evaluated = [r for r in rounds if r.get("test_accuracy") is not None and r.get("round")]
    lines = [f"{name} finished: {summary.get('aggregated_rounds', 0)} of "
             f"{summary.get('rounds')} rounds aggregated in {duration(summary['seconds'])}"
             + (f" (resumed after round {summary['resumed_after_round']})"
                if summary.get("resumed_after_round") else "")]
    if evaluated:
        best = max(evaluated, key=lambda r: float(r["test_accuracy"]))
        last = evaluated[-1]
        lines.append(f"  test accuracy {100 * float(last['test_accuracy']):.2f}% after round "
                     f"{last['round']} (best {100 * float(best['test_accuracy']):.2f}% at round "
                     f"{best['round']})")
        trained = [r for r in rounds if r.get("round")]
        secs = [float(r["round_seconds"]) for r in trained if r.get("round_seconds")]
        vals = [float(r["valuation_seconds"]) for r in trained
                if r.get("valuation_seconds") is not None]
        if secs:
            share = f", valuation {100 * sum(vals) / sum(secs):.0f}% of it" if vals else ""
            lines.append(f"  mean round {sum(secs) / len(secs):.2f}s{share}")
    if payouts:
        top = ", ".join(f"{short_label(p.client_id)} ({p.payout_share:.3f})"
                        for p in payouts[:3])
        lines.append(f"  payout ledger of {len(payouts)} clients; largest shares: {top}")
    lines.append(f"  results in {out_dir}: rounds.jsonl, summary.json, final_model.pt"
                 + (", payouts.csv" if payouts else "") + ", plots/")
    return lines
