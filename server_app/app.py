"""FedOwen ServerApp: run config -> strategy, server evaluation set, records.

The server holds two data sets: the evaluation set (``eval-fraction`` of the original training
split, stratified, never given to clients) on which coalitions are valued, and the official
test split on which the global model's reported accuracy is measured after every round.
Records land in the output dir: ``config.json``, ``rounds.jsonl``, ``ledger.csv``,
``final_model.pt``, ``summary.json``, ``payouts.csv`` (the payout ledger, for runs that
value clients) and ``adversaries.json`` (who attacked, when ``adversary-fraction > 0``).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from fedowen_strategy.contribution import UtilityFactory
from fedowen_strategy.nodes import wait_for_nodes
from fedowen_strategy.payouts import Payout
from fedowen_strategy.replies import record_to_state
from fedowen_strategy.strategy import EvaluateHook, FedOwen, ServerStep
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_strategy.torch_utility.batched import resolve_device
from fedowen_task.adversary.attacks import adversaries_record, attack_of
from fedowen_task.data import DatasetArrays, load_dataset, resolve_data_dir, to_tensor
from fedowen_task.models import build_model
from fedowen_task.partition import holdout_split
from fedowen_task.training import evaluate
from server_app.byzantine import ByzantineGrid
from server_app.config import RunConfig, parse_run_config
from server_app.peers import PerRound, peer_arguments, root_trainer
from server_app.progress import PROGRESS, Progress, Unactionable, quiet, summary_lines
from server_app.store.checkpoint import (
    CHECKPOINT_FILE,
    check_run_config,
    load_checkpoint,
    save_checkpoint,
)
from server_app.store.payouts import ADVERSARIES_FILE, PAYOUTS_FILE, run_payouts, write_payouts
from server_app.store.records import RunRecorder, read_rounds
from server_app.strategies import build_flower_strategy

log = logging.getLogger(__name__)
app = ServerApp()
FINAL_MODEL = "final_model.pt"


def route_library_logs() -> None:
    """Send the library's INFO logs through Flower's handlers (shown by ``--stream``); drop
    Flower's warnings about what the app sets on purpose (:class:`Unactionable`)."""
    if not any(isinstance(f, Unactionable) for f in FLOWER_LOGGER.filters):
        FLOWER_LOGGER.addFilter(Unactionable())
    for name in ("fedowen_strategy", "fedowen_task", "server_app"):
        lib = logging.getLogger(name)
        lib.setLevel(logging.INFO)
        for handler in FLOWER_LOGGER.handlers:
            if handler not in lib.handlers:
                lib.addHandler(handler)
        lib.propagate = False


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


def server_sets(cfg: RunConfig, ds: DatasetArrays) -> tuple[torch.Tensor, ...]:
    """(x_eval, y_eval, x_test, y_test, x_val, y_val): the valuation set, the
    reported-accuracy set and ``validation-fraction``'s set (nobody's data; empty when 0)."""
    eval_idx, val_idx, _ = holdout_split(ds.y_train, cfg.eval_fraction, cfg.validation_fraction,
                                         cfg.seed)
    x_test, y_test = ds.x_test, ds.y_test
    if cfg.test_max_samples and len(y_test) > cfg.test_max_samples:
        keep = np.sort(np.random.default_rng(cfg.seed).choice(
            len(y_test), cfg.test_max_samples, replace=False))
        x_test, y_test = x_test[keep], y_test[keep]
    # torch.tensor copies: the cached label arrays are read-only memory maps, which
    # torch.as_tensor would share (and warn about)
    return (to_tensor(ds.x_train[eval_idx], ds.name),
            torch.tensor(ds.y_train[eval_idx], dtype=torch.long),
            to_tensor(x_test, ds.name), torch.tensor(y_test, dtype=torch.long),
            to_tensor(ds.x_train[val_idx], ds.name),
            torch.tensor(ds.y_train[val_idx], dtype=torch.long))


def client_evaluation(recorder: RunRecorder) -> EvaluateHook:
    """Federated evaluation's aggregated metrics into the round's record (``client_eval``)."""
    return lambda server_round, metrics: recorder.log_train(
        server_round, {"client_eval": metrics}, [])


def build_strategy(cfg: RunConfig, factory: UtilityFactory | None,
                   recorder: RunRecorder | None, server_step: ServerStep | None = None
                   ) -> FedOwen:
    """The FedOwen strategy the run config describes (federated evaluation off: the
    ServerApp evaluates centrally); ``server_step`` serves ``norm-cap = "server"``."""
    return FedOwen(**cfg.fedowen_arguments(), utility_factory=factory,
                   server_step=server_step,
                   on_round=recorder.log_train if recorder else None,
                   on_evaluate=client_evaluation(recorder) if recorder else None)


def _resume(cfg: RunConfig, recorder: RunRecorder, strategy: Strategy,
            model: torch.nn.Module) -> int:
    """Load ``resume-from``'s checkpoint into the strategy and model; rounds already done.

    Refuses (:class:`CheckpointError`) a damaged checkpoint, a NaN model, or one made under a
    run config whose model- or federation-shaping keys differ from ``cfg``.
    """
    if not cfg.resume_from:
        return 0
    ckpt = load_checkpoint(cfg.resume_from)
    check_run_config(ckpt, cfg.federation_config(), cfg.resume_from,
                     defaults=RunConfig().federation_config())
    model.load_state_dict({k: torch.as_tensor(v) for k, v in ckpt.global_state.items()})
    if isinstance(strategy, FedOwen):  # Flower's strategies here are stateless (config-checked)
        strategy.load_state_dict(ckpt.strategy_state)
    # the one resume offset, of FedOwen and of server_app.strategies.Recorded alike
    strategy.round_offset = ckpt.server_round  # type: ignore[attr-defined]
    recorder.truncate_after(ckpt.server_round)
    log.info("Resuming after round %d of %d from %s", ckpt.server_round, cfg.num_server_rounds,
             cfg.resume_from)
    return ckpt.server_round


def make_strategy(cfg: RunConfig, num_nodes: int, model: torch.nn.Module,
                  sets: tuple[torch.Tensor, ...], recorder: RunRecorder) -> Strategy:
    """FedOwen with a coalition utility on the evaluation set, or Flower's strategy."""
    device = resolve_device(cfg.torch_device())
    if cfg.strategy != "fedowen":
        random.seed(cfg.seed)  # Flower's strategies sample nodes with the global random
        return build_flower_strategy(cfg, num_nodes, recorder.log_train,
                                     client_evaluation(recorder),
                                     **peer_arguments(cfg, model, sets, device))
    factory = CoalitionUtility(model, sets[0], sets[1], metric=cfg.utility_metric,
                               device=device)
    # norm-cap = "server": the reference norm is one epoch on the evaluation set, as FLTrust's
    step = (PerRound(root_trainer(cfg, model, sets, device, 0, 1))
            if cfg.norm_cap_mode() == "server" else None)
    return build_strategy(cfg, factory, recorder, step)


def _summary(cfg: RunConfig, out_dir: Path, done: int, seconds: float) -> dict[str, Any]:
    """summary.json's content, from the run's records."""
    rounds = read_rounds(out_dir)
    last = next((r for r in rounds if r["round"] == cfg.num_server_rounds), None)
    acc = last.get("test_accuracy") if last else None
    aggregated = sum(1 for r in rounds if r.get("returned"))
    summary = {"rounds": cfg.num_server_rounds, "strategy": cfg.strategy,
               "valuation": cfg.valuation, "resumed_after_round": done,
               "aggregated_rounds": aggregated,
               "final_test_accuracy": acc if isinstance(acc, float) else None,
               "seconds": seconds, "output_dir": str(out_dir)}
    if aggregated == 0:
        summary["warning"] = ("no round aggregated any update (every reply failed or was "
                              "rejected; see rounds.jsonl): final_model.pt is the initial model")
        log.warning("%s", summary["warning"])
    return summary


def _already_finished(cfg: RunConfig, out_dir: Path, model: torch.nn.Module,
                      recorder: RunRecorder, done: int) -> dict[str, Any]:
    """A resume of a run whose checkpoint is at or past ``num-server-rounds``: run nothing,
    keep ``final_model.pt`` (write the checkpoint's model only where it is missing)."""
    log.info("The run in %s already finished round %d of %d: nothing to resume; its final "
             "model and records are kept", out_dir, done, cfg.num_server_rounds)
    if not (out_dir / FINAL_MODEL).exists():
        torch.save(model.state_dict(), out_dir / FINAL_MODEL)
    summary_file = out_dir / "summary.json"
    if summary_file.exists():
        return dict(json.loads(summary_file.read_text()), already_finished=True)
    summary = _summary(cfg, out_dir, done, 0.0)
    recorder.write_json("summary.json", summary)
    return dict(summary, already_finished=True)


def run(grid: Grid, cfg: RunConfig, out_dir: Path) -> dict[str, Any]:
    """Wait for the nodes, build everything from ``cfg``, run the rounds, save records;
    returns the summary.

    After every round the run is checkpointed atomically (``checkpoint.npz``); with
    ``resume-from`` set it continues from there (FedOwen reproduces the remaining rounds of
    the uninterrupted run).
    """
    # k nodes, or at least half of them after the timeout (fedowen_strategy.nodes): k is
    # capped to the nodes there are
    nodes = wait_for_nodes(grid, cfg.clients_per_round, cfg.node_wait_timeout,
                           what=f"clients-per-round={cfg.clients_per_round}")
    cfg = replace(cfg, clients_per_round=min(cfg.clients_per_round, len(nodes)))
    if cfg.torch_threads:  # torch's default (all cores) was 4-6x slower on a shared 2-core box
        torch.set_num_threads(cfg.torch_threads)
    log.debug("torch threads in the ServerApp: %d (run config torch-threads=%d; 0 = torch's "
              "default)", torch.get_num_threads(), cfg.torch_threads)
    recorder = RunRecorder(out_dir)
    ds = load_dataset(cfg.dataset, resolve_data_dir(cfg.data_dir or None), download=cfg.download)
    sets = server_sets(cfg, ds)
    model = build_model(cfg.model_name(), ds.in_channels, ds.num_classes, seed=cfg.seed)
    strategy = make_strategy(cfg, len(nodes), model, sets, recorder)
    done = _resume(cfg, recorder, strategy, model)
    if done >= cfg.num_server_rounds:
        return _already_finished(cfg, out_dir, model, recorder, done)
    if not done:
        recorder.write_json("config.json", asdict(cfg))
    if cfg.adversary_fraction > 0:
        _record_adversaries(cfg, len(nodes), recorder)
    latest = {"arrays": ArrayRecord(model.state_dict())}  # the global model after each round
    evaluate_fn = central_evaluation(cfg, ds, sets[2:], recorder, strategy, done, out_dir,
                                     latest)
    if cfg.adversary_fraction > 0 and attack_of(cfg.adversary()).server is not None:
        # omniscient attacks: the attackers' replies are replaced here (server_app.byzantine)
        grid = ByzantineGrid(grid, cfg, len(nodes), on_round=lambda server_round, entry:
                             recorder.log_train(server_round, {"attack": entry}, []),
                             server_step=getattr(strategy, "server_step", None))
    started = time.perf_counter()
    banner = RoundBanner(done)  # after a resume Flower would print "[ROUND 1/66]" for round 35
    FLOWER_LOGGER.addFilter(banner)
    try:
        with quiet(cfg.verbose):  # one line per round (server_app.progress); verbose: all
            strategy.start(grid=grid, initial_arrays=latest["arrays"],
                           num_rounds=cfg.num_server_rounds - done, timeout=cfg.round_timeout,
                           train_config=ConfigRecord(), evaluate_fn=evaluate_fn)
    finally:
        FLOWER_LOGGER.removeFilter(banner)
    # Flower's Result.arrays stays empty when no round aggregated: save what was evaluated.
    torch.save(latest["arrays"].to_torch_state_dict(), out_dir / FINAL_MODEL)
    summary = _summary(cfg, out_dir, done, time.perf_counter() - started)
    recorder.write_json("summary.json", summary)
    payouts = _write_payouts(out_dir)
    _draw(out_dir)
    for line in summary_lines(strategy_label(cfg), summary, read_rounds(out_dir), out_dir,
                              payouts):
        log.info("%s", line)
    return summary


def _record_adversaries(cfg: RunConfig, num_nodes: int, recorder: RunRecorder) -> None:
    """``adversaries.json``: who attacked, so reports need not recompute it. Simulation
    only: partitions are numbered 0..N-1 with N the nodes connected at the start
    (``num-supernodes``)."""
    recorder.write_json(ADVERSARIES_FILE, adversaries_record(cfg.adversary(), num_nodes))


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


def central_evaluation(cfg: RunConfig, ds: DatasetArrays, test: tuple[torch.Tensor, ...],
                       recorder: RunRecorder, strategy: Strategy, done: int, out_dir: Path,
                       latest: dict[str, ArrayRecord]
                       ) -> Callable[[int, ArrayRecord], MetricRecord]:
    """The ``evaluate_fn``: test accuracy after every round (and validation accuracy, when
    ``test`` carries a non-empty validation set after the test set), records and a checkpoint;
    the evaluated model is kept in ``latest["arrays"]`` (the final model, even if nothing was
    aggregated)."""
    eval_model = build_model(cfg.model_name(), ds.in_channels, ds.num_classes)
    device, started = resolve_device(cfg.torch_device()), time.perf_counter()
    progress = Progress(cfg.num_server_rounds, done)
    state_of = strategy.state_dict if isinstance(strategy, FedOwen) else dict
    last_end = [started]  # when the previous evaluation finished

    def evaluate_fn(local_round: int, arrays: ArrayRecord) -> MetricRecord:
        # The round's wall time: selection, client training, aggregation (not evaluation)
        round_seconds = time.perf_counter() - last_end[0]
        server_round = local_round + done
        latest["arrays"] = arrays
        eval_model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = evaluate(eval_model, test[0], test[1], device=device)
        if local_round == 0 and done:  # this round's record and checkpoint already exist
            last_end[0] = time.perf_counter()
            return MetricRecord({"test-accuracy": acc, "test-loss": loss})
        record = {"test_accuracy": acc, "test_loss": loss}
        if len(test) > 2 and len(test[3]):
            record["val_loss"], record["val_accuracy"] = evaluate(eval_model, test[2], test[3],
                                                                  device=device)
        line = recorder.log_eval(server_round, {**record, "round_seconds": round_seconds,
                                                "elapsed_seconds": time.perf_counter() - started})
        if server_round > 0:
            save_checkpoint(out_dir / CHECKPOINT_FILE, server_round, record_to_state(arrays),
                            state_of(), cfg.federation_config())
        log.info("%s", progress.line(server_round, line), extra=PROGRESS)
        last_end[0] = time.perf_counter()
        metrics: dict[str, int | float | list[int] | list[float]] = {"test-accuracy": acc,
                                                                   "test-loss": loss}
        if line.get("valuation_seconds") is not None:  # only strategies that value clients
            metrics["valuation-seconds"] = float(line["valuation_seconds"])
        return MetricRecord(metrics)

    return evaluate_fn


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point: the run config is validated before any message is sent."""
    route_library_logs()
    try:
        cfg = parse_run_config(context.run_config)
    except ValueError as err:  # shown by `flwr run --stream`; the traceback only in the log
        log.error("%s", err)
        raise
    out_dir = cfg.resolved_output_dir(context.run_id)
    name = strategy_label(cfg)
    log.info("%s run %s: results go to %s", name, context.run_id, out_dir)
    run(grid, cfg, out_dir)


def strategy_label(cfg: RunConfig) -> str:
    """What a run is called in its log: ``FedOwen (valuation=owen)`` or the strategy's name."""
    if cfg.strategy == "fedowen":
        return f"FedOwen (valuation={cfg.valuation})"
    return f"strategy={cfg.strategy}"
