"""Run one FedOwen simulation through a real ``flwr run`` (Ray) and say where results went.

    python -m fedowen_deploy.cli --rounds 5 --valuation owen --set alpha=0.01

(``scripts/run.sh`` sets up the venv and runs it.) Defaults are the paper's: MNIST, 100
virtual clients, 10 per round, 100 rounds. The data dir is ``--data-dir``, else
``$FEDOWEN_DATA``, else ``../shared/data`` beside the repo when it exists, else
``~/.cache/fedowen/data``; the results go to ``--output-dir``, else a new
``<time>-<dataset>-<valuation>`` folder where the app puts runs without an output dir
(:func:`server_app.config.output_root`: ``$FEDOWEN_OUTPUT``, else ``~/fedowen-runs``). The run
config and the data are checked before any SuperLink starts (a missing dataset fails in
seconds naming the path it searched; ``--set download=true`` fetches it on a machine with
internet access).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from fedowen_deploy.launcher import APP_DIR, LocalSuperLink, flwr_run
from fedowen_deploy.procs import Terminated, exit_on_signals
from fedowen_strategy.round_valuers import METHODS
from fedowen_task.config import parse_scalar
from server_app.config import RunConfig, output_root, parse_run_config
from server_app.store.checkpoint import CHECKPOINT_FILE
from server_app.strategies import NAMES as STRATEGY_NAMES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=100, help="server rounds (paper: 100)")
    p.add_argument("--supernodes", type=int, default=100, help="virtual clients (paper: 100)")
    p.add_argument("--clients-per-round", type=int, default=10, help="k (paper: 10)")
    p.add_argument("--dataset", default="mnist",
                   help="mnist, fashion-mnist, cifar10, femnist or medmnist:<flag>")
    p.add_argument("--valuation", default=RunConfig.valuation, metavar="METHOD",
                   help=f"FedOwen's valuation method: {', '.join(METHODS)}")
    p.add_argument("--strategy", default="fedowen", metavar="NAME",
                   help=f"{', '.join(STRATEGY_NAMES)} or module:Class (a Flower strategy)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="default: $FEDOWEN_DATA, else ../shared/data beside the repo, else "
                   "~/.cache/fedowen/data")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="default: <time>-<dataset>-<valuation> in $FEDOWEN_OUTPUT, else in "
                   "~/fedowen-runs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other run-config key of pyproject.toml, repeatable")
    p.add_argument("--cpus-per-client", type=float, default=1.0)
    p.add_argument("--gpus-per-client", type=float, default=0.0, metavar="SHARE",
                   help="a share of a GPU per virtual client (Flower's client-resources-"
                   "num-gpus; e.g. 0.1 runs 10 clients on each GPU at once; 0: none); the "
                   "clients train on it with --set device=auto")
    # not the README's FLWR_HOME (.flwr-home): the launcher writes its own SuperLink into its
    # home's config.toml, which would point a later `flwr run .` at a SuperLink that is gone
    p.add_argument("--flwr-home", type=Path, default=APP_DIR / ".flwr-launcher",
                   help="FLWR_HOME of this script's own SuperLink (default .flwr-launcher; "
                        "the README's `flwr run` uses .flwr-home)")
    return p.parse_args(argv)


def build_run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The run-config overrides the arguments describe (absolute paths)."""
    from fedowen_task.data import resolve_data_dir  # imports torch: only when a run starts

    stamp = time.strftime("%Y%m%d-%H%M%S")
    method = args.valuation if args.strategy == "fedowen" else args.strategy.replace(":", "-")
    out = args.output_dir or output_root() / f"{stamp}-{args.dataset}-{method}"
    cfg: dict[str, Any] = {
        "num-server-rounds": args.rounds, "clients-per-round": args.clients_per_round,
        "dataset": args.dataset, "valuation": args.valuation, "strategy": args.strategy,
        "data-dir": str(resolve_data_dir(args.data_dir)),
        "output-dir": str(Path(out).resolve()),
    }
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. --set alpha=0.01")
        cfg[key] = parse_scalar(value)
    if cfg.get("resume-from"):  # the app wants an absolute path and writes into it
        cfg["resume-from"] = str(Path(str(cfg["resume-from"])).resolve())
    return cfg


def results_dir(cfg: dict[str, Any]) -> str:
    """Where the ServerApp writes: a resumed run continues in ``resume-from``, else
    ``output-dir`` (``server_app.config.RunConfig.resolved_output_dir``)."""
    return str(cfg.get("resume-from") or cfg["output-dir"])


def resume_hint(argv: list[str], out: str) -> str:
    """What to say after an interrupt: the exact command that continues the run from its
    checkpoint (the same arguments, ``resume-from`` = the run's dir), or that no round
    completed."""
    if not (Path(out) / CHECKPOINT_FILE).is_file():
        return f"interrupted before any round completed: nothing to resume in {out}"
    kept: list[str] = []
    i = 0
    while i < len(argv):  # the output dir is where resume-from points: drop both
        arg = argv[i]
        if arg == "--output-dir" or (arg == "--set" and i + 1 < len(argv)
                                     and argv[i + 1].startswith("resume-from=")):
            i += 2
            continue
        if not arg.startswith("--output-dir="):
            kept.append(arg)
        i += 1
    command = ["bash", "scripts/run.sh", *kept, "--set", f"resume-from={out}"]
    return "interrupted; resume with: " + " ".join(shlex.quote(a) for a in command)


def main(argv: list[str] | None = None) -> int:
    from fedowen_task.data import DatasetNotFoundError, load_dataset  # torch: only to run

    args = parse_args(argv)
    cfg = build_run_config(args)
    try:  # before any SuperLink starts: every problem at once, then the data
        run_config = parse_run_config(cfg)
        load_dataset(run_config.dataset, run_config.data_dir, download=run_config.download)
    except ValueError as err:
        print(f"[fedowen] {err}", file=sys.stderr)
        return 2
    except DatasetNotFoundError as err:
        print(f"[fedowen] data-dir={run_config.data_dir}: {err}", file=sys.stderr)
        return 2
    out = results_dir(cfg)
    print(f"[fedowen] {args.supernodes} virtual clients, {cfg['clients-per-round']} per round, "
          f"{cfg['num-server-rounds']} rounds, "
          f"{'valuation=' + cfg['valuation'] if args.strategy == 'fedowen' else cfg['strategy']}; "
          f"data {cfg['data-dir']}; results in {out}", flush=True)
    # SIGTERM/SIGINT end the run through the `with`: SuperLink, SuperExec, flwr-simulation and
    # Ray are stopped (fedowen_deploy.procs), not left running; the last line says how to go on.
    try:
        with exit_on_signals(), LocalSuperLink(args.flwr_home.resolve()) as link:
            outcome = flwr_run(link, cfg, num_supernodes=args.supernodes,
                               cpus_per_client=args.cpus_per_client,
                               gpus_per_client=args.gpus_per_client, stream_to=sys.stdout)
    except Terminated:
        print(f"[fedowen] {resume_hint(argv if argv is not None else sys.argv[1:], out)}",
              file=sys.stderr, flush=True)
        raise
    if not outcome.ok:
        partial = f"; partial results in {out}" if Path(out).is_dir() else ""
        print(f"[fedowen] run {outcome.run_id} did not complete: status {outcome.status}. "
              f"Logs: {link.log_file} and the output above{partial}", file=sys.stderr)
        return 1
    print(f"[fedowen] run {outcome.run_id} completed. Results in {out}: rounds.jsonl "
          "(per-round records), ledger.csv (contributions), summary.json, final_model.pt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
