"""The ServerApp's data and its central evaluation after every round.

The server holds two data sets of its own: the evaluation set (``eval-fraction`` of the
original training split, stratified, never given to clients) on which coalitions are valued,
and the official test split on which the global model's reported accuracy is measured after
every round, or on ``eval-every``'s schedule (:func:`evaluated`) (with ``validation-fraction``,
also a validation set, nobody's data).

:class:`CentralEvaluation` is the strategies' ``evaluate_fn``: each call measures the round's
global model when the schedule says so, records the round, checkpoints the run, logs the
progress line and hands Flower the metrics, and keeps the round's end (:class:`RoundEnd`: the
model, and when its evaluation finished) for the next round's wall time and for the final model.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from fedowen_strategy.replies import record_to_state
from fedowen_task.adversary.attacks import measured_trigger
from fedowen_task.data import DatasetArrays, to_tensor
from fedowen_task.holdout import holdout_split
from fedowen_task.training import evaluate
from server_app.config import RunConfig
from server_app.progress import PROGRESS, Progress
from server_app.stall import StallWatch
from server_app.store.checkpoint import CHECKPOINT_FILE, save_checkpoint
from server_app.store.records import RunRecorder
from server_app.strategies import ServerStrategy

log = logging.getLogger(__name__)
#: The last rounds measured whatever ``eval-every`` says: the reports read the mean of the last
#: 5 (``sim.results.LAST_K``) and check the last 10 for a collapse
#: (``studies.adversarial.attack_costs``).
EVAL_TAIL = 10


def evaluated(server_round: int, total: int, every: int) -> bool:
    """Whether the central evaluation measures the model after ``server_round`` of ``total``:
    round 0, every ``every``-th round and each of the last :data:`EVAL_TAIL` rounds."""
    return server_round % every == 0 or server_round > total - EVAL_TAIL


class ServerSets(NamedTuple):
    """The server's data: the valuation set, the reported-accuracy (test) set and
    ``validation-fraction``'s set (empty when 0)."""

    x_eval: torch.Tensor
    y_eval: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


def server_sets(cfg: RunConfig, ds: DatasetArrays) -> ServerSets:
    """The server's sets of ``ds`` for this run config (``test-max-samples`` caps the test
    set, seeded)."""
    eval_idx, val_idx, _ = holdout_split(ds.y_train, cfg.eval_fraction, cfg.validation_fraction,
                                         cfg.seed)
    x_test, y_test = ds.x_test, ds.y_test
    if cfg.test_max_samples and len(y_test) > cfg.test_max_samples:
        keep = np.sort(np.random.default_rng(cfg.seed).choice(
            len(y_test), cfg.test_max_samples, replace=False))
        x_test, y_test = x_test[keep], y_test[keep]
    # torch.tensor copies: the cached label arrays are read-only memory maps, which
    # torch.as_tensor would share (and warn about)
    return ServerSets(to_tensor(ds.x_train[eval_idx], ds.name),
                      torch.tensor(ds.y_train[eval_idx], dtype=torch.long),
                      to_tensor(x_test, ds.name), torch.tensor(y_test, dtype=torch.long),
                      to_tensor(ds.x_train[val_idx], ds.name),
                      torch.tensor(ds.y_train[val_idx], dtype=torch.long))


@dataclass(frozen=True)
class ServerParts:
    """What the ServerApp holds: the global model, the server's data, the torch device and
    the run's recorder (strategies and the central evaluation take what they need)."""

    model: torch.nn.Module
    sets: ServerSets
    device: torch.device
    recorder: RunRecorder


@dataclass(frozen=True)
class RoundEnd:
    """The latest evaluated round: its global model (the final model, even when no round
    aggregated) and when its evaluation finished (``time.perf_counter``)."""

    arrays: ArrayRecord
    at: float


class CentralEvaluation:
    """Flower's ``evaluate_fn``: test accuracy after every round (and validation accuracy with
    a validation set), its record, a checkpoint and the progress line.

    Parameters
    ----------
    parts : ServerParts
        The server's data, device and recorder; its model is where the rounds start
        (:attr:`end` until the first evaluation).
    strategy : ServerStrategy
        Whose state each checkpoint keeps.
    done : int
        Rounds completed before this invocation (a resume): round ``r`` of ``start`` is
        round ``r + done`` of the run, and round 0 of a resume is recorded already.
    model : torch.nn.Module
        The evaluation's own model of the run's architecture, which each round's weights are
        loaded into.
    """

    def __init__(self, cfg: RunConfig, parts: ServerParts, strategy: ServerStrategy, *,
                 done: int, model: torch.nn.Module) -> None:
        self.cfg, self.strategy, self.done, self.model = cfg, strategy, done, model
        self.sets, self.recorder, self.device = parts.sets, parts.recorder, parts.device
        self.started = time.perf_counter()
        self.progress = Progress(cfg.num_server_rounds, done)
        self.stall = StallWatch(cfg.max_stalled_rounds, str(self.recorder.output_dir))
        self.end = RoundEnd(ArrayRecord(parts.model.state_dict()), self.started)
        # a backdoor run (a row of the attack table with ``backdoor``) measures its attack
        # success rate every round, with the whole trigger (fedowen_task.adversary.backdoor)
        self.trigger = measured_trigger(cfg.adversary())

    def __call__(self, local_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        # the round's wall time: selection, client training, aggregation (not evaluation)
        round_seconds = time.perf_counter() - self.end.at
        server_round = local_round + self.done
        resumed = local_round == 0 and self.done > 0
        measured = self.measure(arrays) if resumed or evaluated(
            server_round, self.cfg.num_server_rounds, self.cfg.eval_every) else {}
        if resumed:  # this round's record and checkpoint already exist
            self.end = RoundEnd(arrays, time.perf_counter())
            return MetricRecord({"test-accuracy": measured["test_accuracy"],
                                 "test-loss": measured["test_loss"]})
        line = self.recorder.log_eval(server_round, {
            **measured, "round_seconds": round_seconds,
            "elapsed_seconds": time.perf_counter() - self.started})
        if server_round > 0:
            save_checkpoint(self.recorder.output_dir / CHECKPOINT_FILE, server_round,
                            record_to_state(arrays), self.strategy.state_dict(),
                            self.cfg.federation_config())
        log.info("%s", self.progress.line(server_round, line), extra=PROGRESS)
        self.end = RoundEnd(arrays, time.perf_counter())
        self.stall.observe(line)  # raises RunStalled once recorded and checkpointed
        return flower_metrics(measured, line)

    def measure(self, arrays: ArrayRecord) -> dict[str, float]:
        """Test loss and accuracy of ``arrays`` (and validation's, with a validation set; a
        backdoor run's ``attack_success`` on the stamped test images of other classes)."""
        self.model.load_state_dict(arrays.to_torch_state_dict())
        sets = self.sets
        loss, acc = evaluate(self.model, sets.x_test, sets.y_test, device=self.device)
        measured = {"test_accuracy": acc, "test_loss": loss}
        if len(sets.y_val):
            measured["val_loss"], measured["val_accuracy"] = evaluate(
                self.model, sets.x_val, sets.y_val, device=self.device)
        if self.trigger is not None:
            from fedowen_task.adversary.backdoor import attack_success
            from fedowen_task.data import white

            measured["attack_success"] = attack_success(
                self.model.to(self.device), sets.x_test, sets.y_test, self.trigger,
                white(self.cfg.dataset))
        return measured


def flower_metrics(measured: dict[str, float], line: dict[str, Any]) -> MetricRecord | None:
    """What Flower's round log shows: test accuracy and loss (a measured round), and the
    round's valuation time for strategies that value clients; ``None`` when neither."""
    metrics: dict[str, int | float | list[int] | list[float]] = {}
    if measured:
        metrics.update({"test-accuracy": measured["test_accuracy"],
                        "test-loss": measured["test_loss"]})
    if line.get("valuation_seconds") is not None:
        metrics["valuation-seconds"] = float(line["valuation_seconds"])
    return MetricRecord(metrics) if metrics else None
