"""Experiment grids from TOML presets: run them (a real ``flwr run`` per cell, or the inline
backend: same ServerApp and ClientApp code in one process per cell, no Ray) and report.

    python -m sim.experiments run conf/paper-mnist-cpu.toml       # resumable; rerun to continue
    python -m sim.experiments run conf/ablation-mnist.toml --backend inline --jobs 2
    python -m sim.experiments run conf/ablation-mnist.toml --ray-address 10.0.0.5:6379  # a cluster
    python -m sim.experiments status conf/paper-mnist-cpu.toml    # cells done / partial / failed
    python -m sim.experiments report conf/paper-mnist-cpu.toml    # tables + plots to docs/results
    python -m sim.experiments report --results results/paper-mnist-cpu --out docs/results/x

Results go to ``results/<preset>/<cell-id>/`` (git-ignored; ``results/<preset>-<backend>/`` when
``--backend`` overrides the preset's); reports are regenerated from the JSON lines there
alone. See :mod:`sim.grid` for the preset schema, :mod:`sim.runner` for the resume/retry
rules, :mod:`sim.cluster` for cells as Ray tasks on a running cluster (``--ray-address``) and
:mod:`sim.experiments_args` for the flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from fedowen_deploy.launcher import APP_DIR
from fedowen_deploy.procs import exit_on_signals
from sim.archives import archive_cells as archive_cells  # where scripts and tests import it
from sim.archives import archive_sources, keep_archive, restore_cells
from sim.carry import carry_rows
from sim.cell_state import cell_status, read_state
from sim.experiments_args import build_parser
from sim.grid import Cell, Preset, expand_grid
from sim.presets import PresetError, load_preset, parse_preset
from sim.results import drift_summary, sweep_drift
from sim.runner import PRESET_FILE, Runner

log = logging.getLogger(__name__)


def default_results(preset: Preset, backend: str | None = None) -> Path:
    """``results/<preset name>`` in the repository (git-ignored), suffixed ``-<backend>`` when
    the backend is not the preset's own."""
    suffix = f"-{backend}" if backend and backend != preset.backend else ""
    return APP_DIR / "results" / f"{preset.name}{suffix}"


def default_report_dir(preset: Preset) -> Path:
    """``docs/results/<preset name>`` in the repository (committed)."""
    return APP_DIR / "docs" / "results" / preset.name


def _load(args: argparse.Namespace) -> tuple[Preset, Path]:
    if args.preset is not None:
        preset = load_preset(args.preset)
        backend = getattr(args, "backend", None)
        return preset, (args.results or default_results(preset, backend)).resolve()
    if args.results is None:
        raise SystemExit("give a preset TOML file or --results <dir with preset.json>")
    stored = args.results / PRESET_FILE
    if not stored.exists():
        raise SystemExit(f"{stored} not found: --results must be a dir written by "
                         "`python -m sim.experiments run`")
    return parse_preset(json.loads(stored.read_text())), args.results.resolve()


def cmd_run(args: argparse.Namespace) -> int:
    if args.ray_address is not None:
        return cmd_run_on_cluster(args)
    from contextlib import nullcontext

    from tqdm import tqdm

    from fedowen_deploy.launcher import LocalSuperLink, flwr_run
    from fedowen_task.data import resolve_data_dir
    from sim.inline import inline_run

    preset, results = _load(args)
    backend = args.backend or preset.backend
    if backend != "inline" and args.jobs > 1:
        raise SystemExit(f"--jobs {args.jobs} needs --backend inline (flwr runs share one "
                         "SuperLink and its Ray cluster)")
    data_dir = resolve_data_dir(args.data_dir)
    _restore(args, preset, results)
    if backend == "inline":
        runner = Runner(preset, results, data_dir, run_fn=inline_run, link_factory=nullcontext,
                        jobs=args.jobs)
    else:
        runner = Runner(preset, results, data_dir, run_fn=flwr_run, link_factory=LocalSuperLink)
    cells = runner.selected_cells(args.grid, args.where)
    stop_unfit(preset, cells, data_dir)
    print(f"[experiments] {preset.name}: {len(cells)} cells, {preset.num_supernodes} virtual "
          f"clients, backend {backend} (jobs {args.jobs}), results in {results}, data "
          f"{data_dir}", flush=True)
    bar = tqdm(total=len(cells), desc=preset.name, unit="cell", file=sys.stdout,
               dynamic_ncols=True, mininterval=5.0)
    runner.progress = bar.write
    counts = runner.run(retry_failed=args.retry_failed, limit=args.limit, grids=args.grid,
                        where=args.where, bar=bar)
    bar.close()
    print(f"[experiments] {preset.name}: {counts}. Report: python -m sim.experiments report "
          f"{args.preset or '--results ' + str(results)}", flush=True)
    return 0 if counts["failed"] == 0 else 1


def stop_unfit(preset: Preset, cells: Sequence[Cell], data_dir: Path,
               here: bool = True) -> None:
    """Stop before any cell runs when some cannot split their data (:func:`sim.fit.unfit_cells`)
    or the data is missing; with ``here`` False (a cluster's driver, whose nodes hold the data)
    missing data only says that the check is left to each cell."""
    from fedowen_task.data import DatasetNotFoundError
    from sim.fit import unfit_cells

    try:
        unfit = unfit_cells(cells, preset.num_supernodes, data_dir)
    except DatasetNotFoundError as err:
        if here:
            raise SystemExit(f"[experiments] {preset.name}: data-dir={data_dir}: {err}"
                             ) from None
        print(f"[experiments] {preset.name}: data-dir={data_dir} is not on this machine "
              f"({err}); each cell checks its split on its node", flush=True)
        return
    if unfit:
        first = next(c for c in cells if c.cell_id in unfit)
        raise SystemExit(f"[experiments] {preset.name}: {len(unfit)} of {len(cells)} cells "
                         f"cannot split their data among num-supernodes = "
                         f"{preset.num_supernodes}, e.g. {first.label() or first.cell_id}: "
                         f"{unfit[first.cell_id]}. Fix the preset, or select other cells "
                         "(--grid, --where); nothing ran.")


def _restore(args: argparse.Namespace, preset: Preset, results: Path) -> None:
    """``--restore`` (repeatable): unpack each archive's finished cells into ``results``; then
    ``--carry`` (repeatable): carry each committed report's rows for the cells still missing."""
    for archive in args.restore or []:
        results.mkdir(parents=True, exist_ok=True)
        sources = archive_sources(archive)
        count = restore_cells(archive, results)
        where = f" ({len(sources)} parts in {sources[0].parent})" if len(sources) > 1 else ""
        print(f"[experiments] restored {count} cells from {archive}{where}", flush=True)
    for report in args.carry or []:
        if not report.is_dir():
            raise SystemExit(f"--carry {report}: not a folder (give a committed report's "
                             "folder, e.g. docs/results/<preset>)")
        counts = carry_rows(preset, report, results)
        print(f"[experiments] carried the committed rows of {sum(counts.values())} cells from "
              f"{report} ({', '.join(f'{g} {n}' for g, n in counts.items()) or 'no rounds CSV'})",
              flush=True)


def cmd_run_on_cluster(args: argparse.Namespace) -> int:
    """``run --ray-address``: every cell a Ray task on the cluster, run with the inline
    backend (:mod:`sim.cluster`); results, resume and retries as for a local run."""
    from contextlib import ExitStack, nullcontext

    from tqdm import tqdm

    from fedowen_task.data import resolve_data_dir
    from sim.cluster import ClusterUnreachable, connect

    if args.cell_cpus < 0 or args.cell_gpus < 0 or args.cell_cpus + args.cell_gpus == 0:
        raise SystemExit(f"--cell-cpus {args.cell_cpus:g} --cell-gpus {args.cell_gpus:g}: a "
                         "cell needs some CPU or GPU (the default is 1 CPU)")
    if args.backend == "flwr":
        raise SystemExit("--ray-address runs each cell with the inline backend in a Ray task "
                         "(a flwr run would start a Ray simulation inside the task): leave "
                         "out --backend flwr")
    args.backend = "inline"  # also names the default results dir, as for a local inline run
    preset, results = _load(args)
    _restore(args, preset, results)
    with ExitStack() as stack:
        try:
            session = stack.enter_context(connect(args.ray_address, cell_cpus=args.cell_cpus,
                                                  cell_gpus=args.cell_gpus))
        except ClusterUnreachable as err:
            print(f"[experiments] {err}", file=sys.stderr, flush=True)
            return 2
        data_dir = resolve_data_dir(args.data_dir)
        jobs = args.jobs if args.jobs > 1 else max(1, session.slots)
        runner = Runner(preset, results, data_dir, run_fn=session.run_fn,
                        link_factory=nullcontext, jobs=jobs, follow_rounds=False)
        cells = runner.selected_cells(args.grid, args.where)
        stop_unfit(preset, cells, data_dir, here=False)
        print(f"[experiments] {preset.name}: {len(cells)} cells, {preset.num_supernodes} "
              f"virtual clients, inline backend on the {session.describe()}; {jobs} in "
              f"flight; results in {results}, data {data_dir} (the same path on every node)",
              flush=True)
        bar = tqdm(total=len(cells), desc=preset.name, unit="cell", file=sys.stdout,
                   dynamic_ncols=True, mininterval=5.0)
        runner.progress = session.progress = bar.write
        counts = runner.run(retry_failed=args.retry_failed, limit=args.limit,
                            grids=args.grid, where=args.where, bar=bar)
        bar.close()
    print(f"[experiments] {preset.name}: {counts}. Report: python -m sim.experiments report "
          f"{args.preset or '--results ' + str(results)} --backend inline", flush=True)
    return 0 if counts["failed"] == 0 else 1


def cmd_status(args: argparse.Namespace) -> int:
    preset, results = _load(args)
    state = read_state(results)
    counts: dict[str, int] = {}
    for cell in preset.cells():
        events = state.get(cell.cell_id, [])
        st = cell_status(results, cell.cell_id, events)
        counts[st] = counts.get(st, 0) + 1
        if args.verbose or st in ("failed", "partial"):
            err = next((e.get("error") for e in reversed(events) if e.get("error")), "")
            print(f"{cell.cell_id} {st:8s} {cell.grid}: {cell.label()} {err}")
    print(f"{preset.name}: {sum(counts.values())} cells: {counts}")
    if len(preset.grids) > 1:  # how far each table is: which settings are whole
        done = {c.cell_id for c in preset.cells()
                if cell_status(results, c.cell_id, state.get(c.cell_id, [])) == "done"}
        print("  by grid: " + ", ".join(
            f"{g.name} {sum(c.cell_id in done for c in cells)}/{len(cells)}"
            for g in preset.grids for cells in [expand_grid(preset, g)]))
    drift = sweep_drift(preset, results)
    if drift:
        print(f"{preset.name}: {drift_summary(drift)}")
        if args.verbose:
            for cell_id, changes in sorted(drift.items()):
                print(f"  {cell_id}: " + ", ".join(f"{k} {old!r} -> {new!r}"
                                                  for k, (old, new) in changes.items()))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sim.report import report_refusal, write_report

    preset, results = _load(args)
    out = (args.out or default_report_dir(preset)).resolve()
    refused = report_refusal(preset, results, out) if not args.replace else None
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    source = None
    if args.preset is not None:
        path = args.preset.resolve()
        source = str(path.relative_to(APP_DIR) if path.is_relative_to(APP_DIR) else path)
    files = write_report(preset, results, out, command=args.command_note, source=source)
    if args.archive:
        files.append(keep_archive(preset, results, out, source=source))
    print(f"[experiments] report of {results} written to {out}: "
          + ", ".join(sorted(p.name for p in files)))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser(__doc__.split("\n\n")[0].replace("\n", " ")).parse_args(argv)
    if getattr(args, "where", None) is not None:
        args.where = dict(args.where)
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    try:
        with exit_on_signals():  # SIGTERM: the runner's SuperLink and its tree are stopped
            return {"run": cmd_run, "status": cmd_status,
                    "report": cmd_report}[args.command](args)
    except (PresetError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
