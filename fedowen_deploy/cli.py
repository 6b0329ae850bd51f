"""Run one FedOwen simulation through a real ``flwr run`` (Ray) and say where results went.

    python -m fedowen_deploy.cli --rounds 5 --valuation owen --set alpha=0.01

(``scripts/run.sh`` sets up the venv and runs it.) Every run-config key is a flag (``--alpha
0.01`` or ``--set alpha=0.01``); a key not given keeps pyproject.toml's default (the paper's:
MNIST, 10 clients a round, 100 rounds), on 100 virtual clients. The data dir is ``--data-dir``, else
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedowen_deploy.launcher import APP_DIR, LocalSuperLink, flwr_run
from fedowen_deploy.procs import Terminated, exit_on_signals
from fedowen_strategy.round.round_valuers import METHODS
from fedowen_task.config import parse_scalar
from fedowen_task.declare import declared
from server_app.config import RunConfig, output_root, parse_run_config
from server_app.store.checkpoint import CHECKPOINT_FILE
from server_app.strategies import NAMES as STRATEGY_NAMES

#: Keys the CLI names itself: paths it resolves (absolute) before the run config sees them.
PATH_KEYS = ("data-dir", "output-dir")
#: A paper-sized federation (not a run-config key: Flower's num-supernodes).
PAPER_SUPERNODES = 100
#: What a key's flag adds to its declared help (the lists the tests compare with the docs).
MORE_HELP = {"valuation": f": {', '.join(METHODS)}",
             "strategy": f": {', '.join(STRATEGY_NAMES)} or module:Class (a Flower strategy)"}


def _flag_value(type_name: str) -> Callable[[str], Any]:
    """argparse's ``type`` for a key of ``type_name`` (bool: true/false)."""
    if type_name == "bool":
        return lambda raw: {"true": True, "false": False}[raw.lower()]
    return {"int": int, "float": float}.get(type_name, str)


def add_key_flags(p: argparse.ArgumentParser, config: type = RunConfig) -> None:
    """One flag per declared run-config key (:mod:`fedowen_task.declare`), its default the
    declaration's; a flag not given is not sent, so the app's default applies."""
    group = p.add_argument_group("run-config keys (pyproject.toml's defaults)")
    for k in declared(config):
        if k.name in PATH_KEYS:
            continue
        flags = ["--" + k.name, *(["--rounds"] if k.name == "num-server-rounds" else [])]
        text = f"{k.help}{MORE_HELP.get(k.name, '')} (default: {k.default!r})"
        group.add_argument(*flags, dest=k.field, type=_flag_value(k.type), default=None,
                           metavar=k.type.upper(), help=text.replace("%", "%%"))


def parse_args(argv: list[str] | None = None,
               config: type[RunConfig] = RunConfig) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--supernodes", type=int, default=PAPER_SUPERNODES,
                   help=f"virtual clients (paper: {PAPER_SUPERNODES})")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="default: $FEDOWEN_DATA, else ../shared/data beside the repo, else "
                   "~/.cache/fedowen/data")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="default: <time>-<dataset>-<valuation> in $FEDOWEN_OUTPUT, else in "
                   "~/fedowen-runs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any run-config key (or a user's own), repeatable")
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
    add_key_flags(p, config)
    return p.parse_args(argv)


def build_run_config(args: argparse.Namespace,
                     config: type[RunConfig] = RunConfig) -> dict[str, Any]:
    """The run-config overrides the arguments describe: the flags given, then ``--set``, and
    the paths (absolute)."""
    from fedowen_task.data import resolve_data_dir  # imports torch: only when a run starts

    cfg: dict[str, Any] = {k.name: getattr(args, k.field) for k in declared(config)
                           if getattr(args, k.field, None) is not None}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. --set alpha=0.01")
        cfg[key] = parse_scalar(value)
    data_dir, output_dir = (_path_key(cfg, key, flag) for key, flag in
                            zip(PATH_KEYS, (args.data_dir, args.output_dir), strict=True))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    strategy = str(cfg.get("strategy", config.strategy))
    dataset = cfg.get("dataset", config.dataset)
    method = cfg.get("valuation", config.valuation) if strategy == "fedowen" \
        else strategy.replace(":", "-")
    out = output_dir or output_root() / f"{stamp}-{dataset}-{method}"
    cfg["data-dir"] = str(resolve_data_dir(data_dir))
    cfg["output-dir"] = str(Path(out).resolve())
    if cfg.get("resume-from"):  # the app wants an absolute path and writes into it
        cfg["resume-from"] = str(Path(str(cfg["resume-from"])).resolve())
    return cfg


def _path_key(cfg: dict[str, Any], key: str, flag: Path | None) -> Path | None:
    """A path key given as ``--set KEY=PATH`` means ``--KEY PATH`` (taken out of ``cfg``: the
    caller writes it back absolute); given both ways with two paths, the run stops."""
    if key not in cfg:
        return flag
    path = Path(str(cfg.pop(key))).expanduser()
    if flag is not None and flag.expanduser().resolve() != path.resolve():
        raise SystemExit(f"--set {key}={path} and --{key} {flag} name two folders: "
                         f"give one (--{key} PATH)")
    return path


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
        if arg in ("--output-dir", "--resume-from") or (
                arg == "--set" and i + 1 < len(argv) and argv[i + 1].startswith("resume-from=")):
            i += 2
            continue
        if not arg.startswith(("--output-dir=", "--resume-from=")):
            kept.append(arg)
        i += 1
    command = ["bash", "scripts/run.sh", *kept, "--set", f"resume-from={out}"]
    return "interrupted; resume with: " + " ".join(shlex.quote(a) for a in command)


def check_model(run_config: RunConfig, ds: Any) -> None:
    """The model the run config names, built and run on two of the dataset's test inputs, and
    checked against the selector (a layer it reads), as the ServerApp will before its first
    round: a user's network for another input size or class count fails here in seconds, not
    after the SuperLink has started."""
    from fedowen_task.data import to_tensor
    from fedowen_task.models import build_model, check_model_input, state_to_numpy

    name = run_config.model_name()
    model = build_model(name, ds.in_channels, ds.num_classes, seed=run_config.seed)
    check_model_input(model, name, to_tensor(ds.x_test[:2], ds.name), ds.num_classes)
    if bad := run_config.model_problems(state_to_numpy(model), ds.num_classes):
        raise ValueError("; ".join(bad))


def main(argv: list[str] | None = None) -> int:
    from fedowen_task.data import DatasetNotFoundError, load_dataset  # torch: only to run
    from fedowen_task.pool import check_clients_fit

    args = parse_args(argv)
    cfg = build_run_config(args)
    try:  # before any SuperLink starts: every problem at once, then the data
        run_config = parse_run_config(cfg)
        ds = load_dataset(run_config.dataset, run_config.data_dir, download=run_config.download)
        check_model(run_config, ds)
        check_clients_fit(ds, run_config, args.supernodes)
    except ValueError as err:
        print(f"[fedowen] {err}", file=sys.stderr)
        return 2
    except DatasetNotFoundError as err:
        print(f"[fedowen] data-dir={run_config.data_dir}: {err}", file=sys.stderr)
        return 2
    out = results_dir(cfg)
    what = (f"valuation={run_config.valuation}" if run_config.strategy == "fedowen"
            else run_config.strategy)
    print(f"[fedowen] {args.supernodes} virtual clients, {run_config.clients_per_round} per "
          f"round, {run_config.num_server_rounds} rounds, {what}; data {cfg['data-dir']}; "
          f"results in {out}", flush=True)
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
