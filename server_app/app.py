"""FedOwen ServerApp: run config -> the server's data and strategy -> the rounds -> records.

:func:`run` is the whole run on one page: wait for the nodes, load the server's data and
model (:mod:`server_app.evaluation`), build the strategy the run config names
(:mod:`server_app.factory`; every strategy is a :class:`server_app.strategies.ServerStrategy`),
resume it from a checkpoint, run Flower's round loop with the central evaluation after every
round, and finish (:mod:`server_app.finish`). Records land in the output dir:
``config.json``, ``rounds.jsonl``, ``ledger.csv``, ``checkpoint.npz``, ``final_model.pt``,
``summary.json``, ``payouts.csv`` (the payout ledger, for runs that value clients),
``plots/`` and ``adversaries.json`` (who attacked, when ``adversary-fraction > 0``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, Context
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp import Grid, ServerApp

from fedowen_strategy.nodes import wait_for_nodes
from fedowen_strategy.torch_utility.batched import resolve_device
from fedowen_task.adversary.attacks import adversaries_record, attack_of
from fedowen_task.data import load_dataset, resolve_data_dir
from fedowen_task.models import build_model, check_model_input, state_to_numpy
from fedowen_task.pool import check_clients_fit
from server_app.byzantine import ByzantineGrid
from server_app.config import RunConfig, parse_run_config
from server_app.evaluation import CentralEvaluation, ServerParts, server_sets
from server_app.factory import make_strategy, strategy_label
from server_app.finish import already_finished, finish
from server_app.progress import Unactionable, quiet, round_banner
from server_app.stall import RunStalled
from server_app.store.checkpoint import check_run_config, load_checkpoint
from server_app.store.payouts import ADVERSARIES_FILE
from server_app.store.records import RunRecorder
from server_app.strategies import ServerStrategy

log = logging.getLogger(__name__)
app = ServerApp()


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
    set_torch_threads(cfg.torch_threads)
    recorder = RunRecorder(out_dir)
    ds = load_dataset(cfg.dataset, resolve_data_dir(cfg.data_dir or None), download=cfg.download)
    check_clients_fit(ds, cfg, len(nodes))  # or every ClientApp raises it, every round
    sets = server_sets(cfg, ds)
    model = build_model(cfg.model_name(), ds.in_channels, ds.num_classes, seed=cfg.seed)
    check_model_input(model, cfg.model_name(), sets.x_test, ds.num_classes)
    if bad := cfg.model_problems(state_to_numpy(model), ds.num_classes):  # the selector's
        raise ValueError("; ".join(bad))
    parts = ServerParts(model, sets, resolve_device(cfg.torch_device()), recorder)
    strategy = make_strategy(cfg, len(nodes), parts)
    done = resume(cfg, recorder, strategy, model)
    if done >= cfg.num_server_rounds:
        return already_finished(cfg, recorder, model, done)
    record_start(cfg, recorder, done, len(nodes))
    evaluation = CentralEvaluation(cfg, parts, strategy, done=done, model=build_model(
        cfg.model_name(), ds.in_channels, ds.num_classes))
    grid = attacked(grid, cfg, len(nodes), recorder, strategy)
    started = time.perf_counter()
    # one line per round (server_app.progress; verbose: all), rounds numbered after a resume
    with round_banner(done), quiet(cfg.verbose):
        strategy.start(grid=grid, initial_arrays=evaluation.end.arrays,
                       num_rounds=cfg.num_server_rounds - done, timeout=cfg.round_timeout,
                       train_config=ConfigRecord(), evaluate_fn=evaluation)
    return finish(cfg, recorder, evaluation.end.arrays, done, time.perf_counter() - started)


def set_torch_threads(threads: int) -> None:
    """``torch-threads`` (0: torch's default, all cores, which was 4-6x slower on a shared
    2-core box)."""
    if threads:
        torch.set_num_threads(threads)
    log.debug("torch threads in the ServerApp: %d (run config torch-threads=%d; 0 = torch's "
              "default)", torch.get_num_threads(), threads)


def resume(cfg: RunConfig, recorder: RunRecorder, strategy: ServerStrategy,
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
    strategy.load_state_dict(ckpt.strategy_state)
    strategy.round_offset = ckpt.server_round
    recorder.truncate_after(ckpt.server_round)
    log.info("Resuming after round %d of %d from %s", ckpt.server_round, cfg.num_server_rounds,
             cfg.resume_from)
    return ckpt.server_round


def record_start(cfg: RunConfig, recorder: RunRecorder, done: int, num_nodes: int) -> None:
    """``config.json`` (a fresh run) and ``adversaries.json``: who attacked, so reports need
    not recompute it. Simulation only: partitions are numbered 0..N-1 with N the nodes
    connected at the start (``num-supernodes``)."""
    if not done:
        recorder.write_json("config.json", asdict(cfg))  # the recipe's keys as resolved
    log.info("Model %s, local recipe %s", cfg.model_name(), asdict(cfg.train_config()))
    if cfg.adversary_fraction > 0:
        recorder.write_json(ADVERSARIES_FILE, adversaries_record(cfg.adversary(), num_nodes))


def attacked(grid: Grid, cfg: RunConfig, num_nodes: int, recorder: RunRecorder,
             strategy: ServerStrategy) -> Grid:
    """The grid, or for omniscient attacks the grid whose attackers' replies are replaced
    (:mod:`server_app.byzantine`)."""
    if cfg.adversary_fraction <= 0 or attack_of(cfg.adversary()).server is None:
        return grid
    return ByzantineGrid(grid, cfg, num_nodes, on_round=lambda server_round, entry:
                         recorder.log_train(server_round, {"attack": entry}, []),
                         server_step=strategy.server_step, defence=strategy.defence)


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
    log.info("%s run %s: results go to %s", strategy_label(cfg), context.run_id, out_dir)
    try:
        run(grid, cfg, out_dir)
    except RunStalled as err:  # the reason and what to check, above Flower's traceback
        log.error("%s", err)
        raise
