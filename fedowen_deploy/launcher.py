"""Run the app through a real ``flwr run`` on a SuperLink this module starts and stops.

``flwr run .`` alone starts a shared "local" SuperLink on fixed ports that keeps the
environment of whoever started it first (runtime dependency installation on, a foreign
``FLWR_HOME``) and outlives the caller. Here each :class:`LocalSuperLink` is our own process:
simulation mode, runtime dependency installation off, telemetry off, free ports, state and
logs under the given ``FLWR_HOME``, stopped by its pid on exit (also when the run fails).

``flwr run`` exits 0 even when the run failed, so :func:`flwr_run` polls ``flwr list`` for the
run's final status and reports it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import tomli_w

from fedowen_deploy.procs import follow, stop_tree

log = logging.getLogger(__name__)
BIN = Path(sys.executable).parent
APP_DIR = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for every Flower process: offline, no runtime installs, this venv first."""
    env = dict(os.environ)
    env.update(FLWR_HOME=str(flwr_home), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    return env


def superlink_env(flwr_home: Path) -> dict[str, str]:
    """:func:`flower_env` without ``PYTHONPATH``: a SuperLink runs the app it is sent, never
    code from a checkout. (Its working directory matters too: Ray workers import the
    ClientApp by name with it first on their path, so :class:`LocalSuperLink` starts in
    ``flwr_home``.)"""
    env = flower_env(flwr_home)
    env.pop("PYTHONPATH", None)
    return env


@dataclass
class LocalSuperLink:
    """A simulation-mode SuperLink owned by this process (use as a context manager)."""

    flwr_home: Path
    name: str = "fedowen-sim"
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    cwd: Path | None = None  # None: flwr_home (see superlink_env)
    # More environment for the SuperLink and what it starts, e.g. RAY_ADDRESS: Flower's Ray
    # backend then attaches to that cluster (docs/deployment.md, section 8).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def log_file(self) -> Path:
        return self.flwr_home / "superlink" / "superlink.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    def __enter__(self) -> LocalSuperLink:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        # flwr 1.41-1.42 serve the Control, Fleet and runtime APIs on one HTTP port.
        self.ports = {"http": free_port()}
        cmd = [str(BIN / "flower-superlink"), "--insecure", "--simulation",
               "--isolation", "subprocess", "--disable-runtime-dependency-installation",
               "--host", "127.0.0.1", "--port", str(self.ports["http"]),
               "--database", str(self.log_file.parent / "state.db"),
               "--log-file", str(self.log_file)]
        self.process = subprocess.Popen(cmd, env={**superlink_env(self.flwr_home), **self.env},
                                        cwd=self.cwd or self.flwr_home,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        self._wait_ready()
        (self.flwr_home / "config.toml").write_text(tomli_w.dumps({"superlink": {
            "default": self.name,
            self.name: {"address": self.address, "insecure": True}}}))
        return self

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {self.process.returncode}; "
                                   f"see {self.log_file}")
            try:
                with socket.create_connection(("127.0.0.1", self.ports["http"]), 0.5):
                    return
            except OSError:
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"flower-superlink not ready after {timeout:.0f}s; see {self.log_file}")

    def __exit__(self, *exc: object) -> None:
        """Stop the SuperLink and everything beneath it: SuperExec, flwr-simulation, Ray."""
        if self.process is not None:
            stop_tree(self.process, grace=20)


@dataclass(frozen=True)
class RunOutcome:
    """What became of one ``flwr run``."""

    run_id: int | None
    status: str
    output: str

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


def _run_status(run_id: int, env: dict[str, str]) -> str:
    out = subprocess.run([str(BIN / "flwr"), "list", "--run-id", str(run_id), "--format",
                          "json"], env=env, capture_output=True, text=True, check=False)
    try:
        runs = json.loads(out.stdout).get("runs", [])
    except json.JSONDecodeError:
        return "unknown"
    return str(runs[0].get("status", "unknown")) if runs else "unknown"


class SuperLinkConnection(Protocol):
    """What :func:`flwr_run` needs of a SuperLink: its ``FLWR_HOME`` and connection name."""

    flwr_home: Path
    name: str


def federation_config(num_supernodes: int | None, cpus_per_client: float,
                      gpus_per_client: float = 0.0) -> str:
    """``flwr run``'s ``--federation-config`` of a simulation: Flower's own options for the
    number of virtual clients and each one's share of CPUs and of a GPU (Ray packs
    ``floor(1 / share)`` clients onto each GPU; 0: no GPU asked for)."""
    if gpus_per_client < 0 or cpus_per_client <= 0:
        raise ValueError(f"cpus-per-client={cpus_per_client} must be > 0 and "
                         f"gpus-per-client={gpus_per_client} >= 0")
    cpus = int(cpus_per_client) if float(cpus_per_client).is_integer() else cpus_per_client
    fed = f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus}"
    return fed + (f" client-resources-num-gpus={gpus_per_client}" if gpus_per_client > 0 else "")


def flwr_run(superlink: SuperLinkConnection, run_config: dict[str, Any], *,
             num_supernodes: int | None = None, cpus_per_client: float = 1.0,
             gpus_per_client: float = 0.0, app_dir: Path = APP_DIR, timeout: float = 3600,
             stream_to: Any = None) -> RunOutcome:
    """Submit the app with ``run_config`` overrides, follow its logs, return its final status.

    ``stream_to`` (a text file object, e.g. ``sys.stdout``) receives the run's log as it comes.
    ``num_supernodes``, ``cpus_per_client`` and ``gpus_per_client`` (a share of a GPU per
    virtual client, Flower's ``client-resources-num-gpus``; 0: none) form the simulation
    federation config; leave
    ``num_supernodes`` None for a deployment SuperLink (e.g.
    ``fedowen_deploy.rehearsal.SecureSuperLink``).
    """
    env = flower_env(superlink.flwr_home)
    cfg_file = superlink.flwr_home / f"run-config-{os.getpid()}-{time.time_ns()}.toml"
    cfg_file.write_text(tomli_w.dumps(run_config))
    fed = federation_config(num_supernodes, cpus_per_client, gpus_per_client)
    cmd = [str(BIN / "flwr"), "run", str(app_dir), superlink.name, "--run-config", str(cfg_file)]
    if num_supernodes is not None:  # simulation; a deployment's federation is its SuperNodes
        cmd += ["--federation-config", fed]
    cmd.append("--stream")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        lines, _ = follow(proc, stream_to, timeout)
    finally:  # also on SIGTERM/SIGINT (procs.exit_on_signals): no `flwr run` left behind
        stop_tree(proc, grace=5)
        if proc.stdout is not None:
            proc.stdout.close()
    output = "".join(lines)
    match = re.search(r"run(?:\s+ID)?[:\s]+(\d{6,})", output, re.IGNORECASE)
    if match is None:
        return RunOutcome(None, "not-submitted", output)
    run_id = int(match.group(1))
    return RunOutcome(run_id, final_status(partial(_run_status, run_id, env), deadline), output)


#: Seconds an ``unknown`` status (``flwr list`` not answering yet, or not listing the run yet)
#: is asked again before it is taken as the answer.
UNKNOWN_GRACE = 10.0


def final_status(poll: Callable[[], str], deadline: float, grace: float = UNKNOWN_GRACE,
                 sleep: Callable[[float], None] = time.sleep) -> str:
    """``poll()`` once a second while the run is pending, starting or running (until
    ``deadline``, a ``time.monotonic`` value), and while it reads ``unknown`` for up to
    ``grace`` seconds: right after the log stream ends the SuperLink may not answer yet."""
    status = poll()
    unknown_until = time.monotonic() + grace
    while time.monotonic() < deadline and (
            status.startswith(("pending", "starting", "running"))
            or (status == "unknown" and time.monotonic() < unknown_until)):
        sleep(1.0)
        status = poll()
    return status
