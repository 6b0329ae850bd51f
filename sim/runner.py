"""Run a preset's cells resumably: one ``flwr run`` at a time, or inline cells in parallel.

Each cell's output dir is ``<results>/<cell-id>/`` (the app writes ``rounds.jsonl``,
``ledger.csv``, ``config.json``, ``checkpoint.npz`` and, when finished, ``summary.json`` there;
the runner adds ``flwr.log``, the run's streamed log). State lives in the files:

- a cell with ``summary.json`` is done and never run again;
- a cell with ``checkpoint.npz`` but no summary continues through ``resume-from``;
- a failed attempt is appended to ``<results>/cells.jsonl`` with its status and the tail of
  its log; the cell is retried once, and after a second failure marked ``failed`` there (later
  invocations skip it unless asked to retry failed cells);
- every attempt appends the code it ran (git commit, and whether tracked files differed from
  it) and the machine it ran on to the cell's ``code.json``; a setting whose cells ran on more
  than one machine is named in a warning at the end of each invocation.

One SuperLink serves all cells of an invocation; it is restarted when it died or a run failed
(a timed-out run may still be running on it). The inline backend needs no SuperLink and runs
``jobs`` cells at once, each in its own process.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from fedowen_deploy.procs import stopping
from server_app.store.records import ROUNDS_FILE
from server_app.strategies import RESUMABLE
from sim.cell_state import (
    CHECKPOINT,
    CODE_FILE,
    SUMMARY_FILE,
    append_state,
    cell_status,
    mixed_machines,
    note_machine,
    read_state,
    record_code,
)
from sim.follow import log_tail, watch_rounds
from sim.grid import Cell, Preset, expand_grid
from sim.results import matches_point, moved_defaults

log = logging.getLogger(__name__)
PRESET_FILE = "preset.json"
LOG_FILE = "flwr.log"
ATTEMPTS = 2  # the first try and one retry
INTERRUPTED = "interrupted: the runner is stopping"
FRESH_START_FILES = ("rounds.jsonl", "ledger.csv", "config.json")

RunFn = Callable[..., Any]  # fedowen_deploy.launcher.flwr_run's signature
LinkFactory = Callable[[Path], AbstractContextManager[Any]]


class _Link:
    """The one SuperLink of an invocation, (re)started on demand."""

    def __init__(self, factory: LinkFactory, flwr_home: Path) -> None:
        self.factory, self.flwr_home = factory, flwr_home
        self._cm: AbstractContextManager[Any] | None = None
        self._link: Any = None

    def get(self) -> Any:
        proc = getattr(self._link, "process", None)
        if self._link is not None and proc is not None and proc.poll() is not None:
            log.warning("SuperLink died (exit %s); restarting it", proc.returncode)
            self.close()
        if self._link is None:
            self._cm = self.factory(self.flwr_home)
            self._link = self._cm.__enter__()
        return self._link

    def close(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
        self._cm, self._link = None, None


class Runner:
    """Runs a preset's cells resumably; ``run_fn`` and ``link_factory`` are injectable
    (tests pass fakes; the CLI passes :func:`fedowen_deploy.launcher.flwr_run` and
    :class:`fedowen_deploy.launcher.LocalSuperLink`, :func:`sim.inline.inline_run` and no link, or a
    Ray cluster's :meth:`sim.cluster.ClusterSession.run_fn`). ``jobs`` > 1 runs that many cells
    at once (only for a ``run_fn`` that needs no shared SuperLink). ``follow_rounds``: one
    progress line per round as ``rounds.jsonl`` grows (off where the records arrive whole, as
    from a cluster)."""

    def __init__(self, preset: Preset, results: Path, data_dir: Path, *, run_fn: RunFn,
                 link_factory: LinkFactory, flwr_home: Path | None = None,
                 progress: Callable[[str], None] | None = None, jobs: int = 1,
                 follow_rounds: bool = True) -> None:
        if jobs < 1:
            raise ValueError(f"jobs={jobs} must be >= 1")
        self.preset, self.results, self.data_dir = preset, results, data_dir
        self.run_fn, self.jobs, self.follow_rounds = run_fn, jobs, follow_rounds
        self.link = _Link(link_factory, flwr_home or results / ".flwr-home")
        self.progress = progress or (lambda msg: log.info("%s", msg))

    def cell_config(self, cell: Cell) -> dict[str, Any]:
        """The cell's run config with its paths; ``resume-from`` when it has a checkpoint."""
        out = (self.results / cell.cell_id).resolve()
        cfg = {**cell.run_config, "output-dir": str(out), "data-dir": str(self.data_dir)}
        if ((out / CHECKPOINT).exists() and not (out / SUMMARY_FILE).exists()
                and cell.config.strategy in RESUMABLE):
            cfg["resume-from"] = str(out)  # others (FedAvgM, FoolsGold) start again
        return cfg

    def _attempt(self, cell: Cell, attempt: int) -> tuple[bool, str]:
        out = self.results / cell.cell_id
        out.mkdir(parents=True, exist_ok=True)
        cfg = self.cell_config(cell)
        if "resume-from" not in cfg:  # a fresh start: no stale records to append to
            for name in (*FRESH_START_FILES, CODE_FILE):
                (out / name).unlink(missing_ok=True)
        record_code(out, attempt, "resume-from" in cfg)
        total = int(cfg.get("num-server-rounds", 100))

        def on_round(rec: dict[str, Any]) -> None:
            acc, val = rec.get("test_accuracy"), rec.get("valuation_seconds")
            self.progress(f"  [{cell.cell_id}] round {rec.get('round')}/{total}: "
                          f"acc {acc if acc is None else f'{acc:.4f}'}"
                          + ("" if val is None else f", valuation {val:.2f}s"))

        started = time.monotonic()
        follow = watch_rounds(out / ROUNDS_FILE, on_round) if self.follow_rounds \
            else nullcontext()
        with (out / LOG_FILE).open("a") as fh, follow:
            fh.write(f"\n=== attempt {attempt} {time.strftime('%Y-%m-%dT%H:%M:%S')} "
                     f"resume={'resume-from' in cfg} ===\n")
            fh.flush()
            try:
                outcome = self.run_fn(self.link.get(), cfg,
                                      num_supernodes=self.preset.num_supernodes,
                                      cpus_per_client=self.preset.cpus_per_client,
                                      timeout=self.preset.cell_timeout, stream_to=fh)
                status = str(outcome.status)
                ok = bool(outcome.ok) and (out / SUMMARY_FILE).exists()
            except Exception as err:  # the launcher itself failed (SuperLink would not start)
                status, ok = f"error: {type(err).__name__}: {err}", False
        seconds = time.monotonic() - started
        note_machine(out, str(cfg.get("device", "auto")))
        if not ok and stopping():  # we stopped it (SIGTERM to the runner): not the cell's fault
            return False, INTERRUPTED
        if ok:
            append_state(self.results, {"cell": cell.cell_id, "event": "done",
                                        "attempt": attempt, "seconds": round(seconds, 1)})
        else:
            if not status.startswith("error"):
                status = f"run status {status}" + ("" if (out / SUMMARY_FILE).exists()
                                                   else ", no summary.json")
            append_state(self.results, {"cell": cell.cell_id, "event": "error",
                                        "attempt": attempt, "error": status,
                                        "seconds": round(seconds, 1),
                                        "log_tail": log_tail(out / LOG_FILE)})
            self.link.close()  # a timed-out or broken run may still occupy it
        return ok, status

    def run_cell(self, cell: Cell) -> str:
        """Run (or resume) one cell with one retry; returns ``done`` or ``failed``, or
        ``not-run`` once the runner is being stopped (a cell stopped by the signal is neither
        retried nor marked failed: the next invocation resumes it)."""
        status = ""
        for attempt in range(1, ATTEMPTS + 1):
            if stopping():
                return "not-run"
            ok, status = self._attempt(cell, attempt)
            if ok:
                return "done"
            if status == INTERRUPTED:
                return "not-run"
            self.progress(f"  [{cell.cell_id}] attempt {attempt} failed: {status}")
        append_state(self.results, {"cell": cell.cell_id, "event": "failed", "error": status,
                                    "log_tail": log_tail(self.results / cell.cell_id / LOG_FILE)})
        return "failed"

    def selected_cells(self, grids: list[str] | None = None,
                       where: dict[str, Any] | None = None) -> list[Cell]:
        """The preset's cells, or those of the named grids (unknown names are an error), and of
        those the ones matching every ``where`` key (a grid-point key such as ``alpha`` or
        ``variant``, or a run-config key); a ``where`` that matches no cell is an error."""
        cells = self.preset.cells()
        if grids:
            wanted = {self.preset.grid(name).name for name in grids}
            keep = {c.cell_id for g in self.preset.grids if g.name in wanted
                    for c in expand_grid(self.preset, g)}
            cells = [c for c in cells if c.cell_id in keep]
        if where:
            matched = [c for c in cells if matches_point(c, where)]
            if not matched:
                shown = " ".join(f"{k}={v}" for k, v in where.items())
                raise KeyError(f"--where {shown} matches none of the {len(cells)} cells "
                               f"selected of preset {self.preset.name!r}: give a grid axis's "
                               "value as the preset spells it (e.g. alpha=0.01, "
                               "variant=fedowen)")
            cells = matched
        return cells

    def run(self, *, retry_failed: bool = False, limit: int | None = None,
            grids: list[str] | None = None, where: dict[str, Any] | None = None,
            bar: Any = None) -> dict[str, int]:
        """Run every cell not yet done; returns counts by final status.

        ``limit`` caps the cells started, ``grids`` and ``where`` keep the cells
        :meth:`selected_cells` keeps, ``bar`` is a tqdm-like object (``update``,
        ``set_postfix_str``) or None.
        """
        self.results.mkdir(parents=True, exist_ok=True)
        (self.results / PRESET_FILE).write_text(json.dumps(self.preset.to_json(), indent=2))
        state = read_state(self.results)
        counts = {"done": 0, "failed": 0, "skipped-failed": 0, "not-run": 0}

        def tick() -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"done {counts['done']} failed "
                                    f"{counts['failed'] + counts['skipped-failed']}")

        todo: list[tuple[Cell, str]] = []
        for cell in self.selected_cells(grids, where):
            st = cell_status(self.results, cell.cell_id, state.get(cell.cell_id, []))
            if st == "done" and self._moved(cell):  # a key only when there are some
                counts["moved-defaults"] = counts.get("moved-defaults", 0) + 1
            elif st == "done" or (st == "failed" and not retry_failed):
                counts["done" if st == "done" else "skipped-failed"] += 1
            elif limit is not None and len(todo) >= limit:
                counts["not-run"] += 1
            else:
                todo.append((cell, st))
                continue
            tick()

        def work(cell: Cell, st: str) -> str:
            self.progress(f"[{cell.cell_id}] {cell.grid}: {cell.label()} ({st})")
            return self.run_cell(cell)

        try:
            if self.jobs == 1:
                for cell, st in todo:
                    counts[work(cell, st)] += 1
                    tick()
            else:
                with ThreadPoolExecutor(self.jobs) as pool:
                    futures = [pool.submit(work, cell, st) for cell, st in todo]
                    try:
                        for future in as_completed(futures):
                            counts[future.result()] += 1
                            tick()
                    except BaseException:  # SIGTERM/SIGINT: start no further cell
                        for future in futures:
                            future.cancel()
                        raise
        finally:
            self.link.close()
        self.warn_mixed_machines()
        return counts

    def _moved(self, cell: Cell) -> bool:
        """Whether a finished cell ran under other defaults than today's (it is then not
        counted as done, and not run again over its records); says which keys moved."""
        moved = moved_defaults(cell, self.results / cell.cell_id, self.preset.auto_selection)
        if moved:
            what = ", ".join(f"{k.replace('_', '-')} {json.dumps(old)} -> {json.dumps(new)}"
                             for k, (old, new) in sorted(moved.items()))
            self.progress(f"[{cell.cell_id}] finished under other defaults ({what}): not "
                          "counted as done; pin the old values in the preset, or move the "
                          "cell's folder away to run it under today's")
        return bool(moved)

    def warn_mixed_machines(self) -> None:
        """Warn of each setting (a grid's point without its rows and seed) whose recorded
        cells ran on more than one machine: a GPU and a CPU round floats differently."""
        settings: dict[str, list[str]] = {}
        for cell in self.preset.cells():
            keys = self.preset.grid(cell.grid).column_keys
            label = " ".join([f"grid {cell.grid}", *(f"{k}={cell.point.get(k)}" for k in keys)])
            settings.setdefault(label, []).append(cell.cell_id)
        for label, machines in sorted(mixed_machines(self.results, settings).items()):
            message = (f"warning: the cells of {label} ran on {len(machines)} machines "
                       f"({'; '.join(sorted(machines))}): not one machine per setting")
            log.warning("%s", message)
            self.progress(message)
