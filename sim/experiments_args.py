"""The experiments command line's arguments: its three subcommands (run, status, report) and
their flags, with the help that ``python -m sim.experiments <command> --help`` prints.
:mod:`sim.experiments` parses with it and runs the commands.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from sim.archives import ARCHIVE, MANIFEST
from sim.grid import BACKENDS


def where_pair(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``run --where``: the value read as TOML (``0.01``, ``true``), else kept
    as the text (``fedowen``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or not raw.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. alpha=0.01")
    try:
        value: Any = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip(), value


def build_parser(description: str) -> argparse.ArgumentParser:
    """The parser of ``python -m sim.experiments``, its help headed by ``description``."""
    p = argparse.ArgumentParser(description=description)
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("run", "run the preset's cells (resumable)"),
                           ("status", "count cells by status"),
                           ("report", "write tables and plots from the results")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("preset", type=Path, nargs="?", default=None, help="conf/<preset>.toml")
        s.add_argument("--results", type=Path, default=None,
                       help="results dir (default results/<preset name>)")
    run, status, report = (sub.choices[n] for n in ("run", "status", "report"))
    for sub_parser in (run, status, report):
        sub_parser.add_argument("--backend", choices=BACKENDS, default=None,
                                help="flwr (a real flwr run per cell) or inline (no Ray); "
                                     "default: the preset's")
    status.add_argument("-v", "--verbose", action="store_true", help="list every cell")
    add_run_flags(run)
    add_report_flags(report)
    return p


def add_run_flags(run: argparse.ArgumentParser) -> None:
    """``run``'s own flags: parallelism (jobs, a Ray cluster), which cells, and restoring
    archived or carried cells first."""
    run.add_argument("--jobs", type=int, default=1,
                     help="cells at once (inline backend only; one process each; with "
                          "--ray-address: cells in flight, default what the cluster fits)")
    run.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="run every cell as a Ray task on this running cluster (host:port "
                          "of `ray start --head`, ray://host:10001, or auto), with the "
                          "inline backend; docs/deployment.md, section 8")
    run.add_argument("--cell-cpus", type=float, default=1.0,
                     help="CPUs each cell's Ray task asks for (with --ray-address)")
    run.add_argument("--cell-gpus", type=float, default=0.0,
                     help="GPUs each cell's Ray task asks for (with --ray-address)")
    run.add_argument("--data-dir", type=Path, default=None)
    run.add_argument("--retry-failed", action="store_true",
                     help="run cells marked failed again (one more retry each)")
    run.add_argument("--limit", type=int, default=None, help="start at most this many cells")
    run.add_argument("--grid", action="append", default=None, metavar="NAME",
                     help="only this grid's cells (one table), repeatable")
    run.add_argument("--where", action="append", default=None, type=where_pair,
                     metavar="KEY=VALUE",
                     help="only cells whose grid point (or run config) has this value, e.g. "
                          "alpha=0.01 (a setting's cells alone, so that a short call finishes "
                          "one setting whole); repeatable, all must hold")
    run.add_argument("--restore", type=Path, action="append", default=None, metavar="ARCHIVE",
                     help=f"first unpack archived cells into the results dir (finished cells "
                          f"are not run again): a report's {MANIFEST} or folder, a folder of "
                          f"parts (archives/<preset>), or one archive ({ARCHIVE} or .tar.xz); "
                          "repeatable")
    run.add_argument("--carry", type=Path, action="append", default=None, metavar="REPORT",
                     help="then, for every finished cell the results dir lacks, carry its "
                          "rows from this committed report's <grid>-rounds.csv (when its "
                          "records were lost; sim/carry.py says what a carried cell lacks); "
                          "with --limit 0 nothing else runs")


def add_report_flags(report: argparse.ArgumentParser) -> None:
    """``report``'s own flags: where the report goes, archiving the records, the command
    note."""
    report.add_argument("--out", type=Path, default=None,
                        help="report dir (default docs/results/<preset name>)")
    report.add_argument("--archive", action="store_true",
                        help="also archive the finished cells' records (run --restore unpacks "
                             "them) in parts under 1 MB, archives/<preset>/cells-partNN.tar.xz "
                             f"for a report in docs/results/<preset>, and write {MANIFEST} "
                             "beside the report")
    report.add_argument("--replace", action="store_true",
                        help="write the report even where --out holds more archived cells "
                             "than the results have finished (refused otherwise)")
    report.add_argument("--command-note", default=None,
                        help="the command that produced the results, quoted in the README")
