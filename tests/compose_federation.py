"""docker/compose.yml brought up for a test: certificates, state and outputs in a folder of the
test's, the repository's compose file unchanged, the host's ``flwr`` CLI as the operator's.

Used by ``tests/test_docker_deployment.py`` (marker ``docker``). Paths in the compose file
(``./certs``, ``./state``, ``./outputs``) resolve against ``--project-directory``, so nothing is
written into ``docker/``. Works with Compose v2 (``docker compose``) or Debian's 1.29
(``docker-compose``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TextIO

import tomli_w

from fedowen_deploy.launcher import APP_DIR, BIN, RunOutcome, flower_env, flwr_run, free_port
from fedowen_deploy.rehearsal import make_certs

COMPOSE_FILE = APP_DIR / "docker" / "compose.yml"
EDGE_FILE = APP_DIR / "docker" / "compose.edge.yml"
IMAGE_UID = 49999  # the user `app` of the Flower images
SITES = [f"site-{i}" for i in range(3)]


def docker_up() -> str | None:
    """Why Docker cannot be used here, or None when dockerd answers and compose exists."""
    if shutil.which("docker") is None:
        return "no docker client (scripts/docker-images.sh engine installs one)"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60,
                      check=False).returncode != 0:
        return "dockerd is not running (scripts/docker-images.sh engine starts it)"
    if not compose_command():
        return "no `docker compose` nor `docker-compose` (apt-get install docker-compose)"
    return None


@cache
def compose_command() -> tuple[str, ...]:
    """``docker compose`` (v2) where the plugin exists, else ``docker-compose`` (v1)."""
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=60,
            check=False).returncode == 0:
        return ("docker", "compose")
    return ("docker-compose",) if shutil.which("docker-compose") else ()


def chown_tree(path: Path, uid: int = IMAGE_UID) -> None:
    """Give ``path`` and everything below it to the images' user (they run as uid 49999)."""
    for item in [path, *path.rglob("*")]:
        os.chown(item, uid, uid)


@dataclass
class ComposeFederation:
    """The one-host federation of ``docker/compose.yml`` under project name ``project``."""

    work: Path
    data_dir: Path
    project: str = "fedowen-e2e"
    # compose.edge.yml's device-sized nodes: (COMPOSE_FILE, EDGE_FILE), the edge sites and their
    # services named, so compose.yml's own SuperNodes stay down
    files: tuple[Path, ...] = (COMPOSE_FILE,)
    key_prefix: str = "site-"  # make-certs.sh names the keys (and client ids) PREFIX<i>
    sites: tuple[str, ...] = tuple(SITES)
    services: tuple[str, ...] = ()  # what ``up`` starts; empty: every service
    extra_env: dict[str, str] = field(default_factory=dict)  # compose variables of the caller
    name: str = "docker"  # the connection's name in $FLWR_HOME/config.toml
    control_port: int = field(default_factory=free_port)
    fleet_port: int = field(default_factory=free_port)
    flwr_home: Path = field(init=False)  # the operator's: config.toml names the SuperLink

    def __post_init__(self) -> None:
        self.flwr_home = self.work / "flwr-home"

    @property
    def certs(self) -> Path:
        return self.work / "certs"

    @property
    def outputs(self) -> Path:
        return self.work / "outputs"

    @property
    def env(self) -> dict[str, str]:
        data = str(self.data_dir)
        return {**os.environ, "FEDOWEN_DATA_DIR": data,
                **{f"FEDOWEN_DATA_DIR_SITE_{i}": data for i in range(len(SITES))},
                "FEDOWEN_CONTROL_PORT": str(self.control_port),
                # the devices' port, on loopback here (on a server: all interfaces)
                "FEDOWEN_FLEET_PORT": f"127.0.0.1:{self.fleet_port}", **self.extra_env}

    def compose(self, *args: str, timeout: float = 600, check: bool = True
                ) -> subprocess.CompletedProcess[str]:
        cmd = [*compose_command(), *(a for f in self.files for a in ("-f", str(f))),
               "--project-directory",
               str(self.work), "-p", self.project, *args]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} -> {proc.returncode}:\n{proc.stdout}\n"
                               f"{proc.stderr}")
        return proc

    def up(self) -> None:
        """Certificates and keys, folders owned by uid 49999, ``up -d`` (the images must
        exist: scripts/docker-images.sh), then the operator's ``config.toml``."""
        make_certs(self.certs, len(self.sites), prefix=self.key_prefix)
        for sub in ("state", "outputs"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("certs", "state", "outputs"):
            chown_tree(self.work / sub)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        (self.flwr_home / "config.toml").write_text(tomli_w.dumps({"superlink": {
            "default": self.name, self.name: {
                "address": f"127.0.0.1:{self.control_port}",
                "root-certificates": str(self.certs / "ca.crt")}}}))
        self.compose("up", "-d", "--no-build", *self.services)

    def down(self) -> None:
        """Keep every service's log in ``work/compose.log``, then remove the containers."""
        logs = self.compose("logs", "--no-color", "--timestamps", check=False)
        (self.work / "compose.log").write_text(logs.stdout + logs.stderr)
        self.compose("down", "--remove-orphans", "--timeout", "20", check=False)

    def logs(self, service: str) -> str:
        proc = self.compose("logs", "--no-color", service, check=False)
        return proc.stdout + proc.stderr

    def container(self, service: str) -> str:
        """The id of the service's container (running or not)."""
        cid = self.compose("ps", "-q", service).stdout.strip()
        if not cid:
            raise RuntimeError(f"no container for service {service}")
        return cid

    def running(self, service: str) -> bool:
        out = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}",
                              self.container(service)], capture_output=True, text=True,
                             check=False).stdout.strip()
        return out == "true"

    def network(self, suffix: str) -> str:
        """The docker network compose made for ``networks: {suffix}``."""
        out = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}",
                              "--filter", f"label=com.docker.compose.project={self.project}"],
                             capture_output=True, text=True, check=True).stdout.split()
        return next(n for n in out if n.endswith(f"_{suffix}"))

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The host's ``flwr`` CLI against the SuperLink's loopback port (TLS, ca.crt)."""
        return subprocess.run([str(BIN / "flwr"), *args], env=flower_env(self.flwr_home),
                              capture_output=True, text=True, timeout=timeout, check=False)

    def nodes(self) -> dict[int, str]:
        """``flwr supernode list``: node id -> status."""
        try:
            reply = json.loads(self.flwr("supernode", "list", self.name, "--format",
                                         "json").stdout)
        except json.JSONDecodeError:
            return {}
        return {int(n["node-id"]): str(n.get("status")) for n in reply.get("nodes", [])}

    def runs(self) -> dict[int, str]:
        """``flwr list``: run id -> status."""
        try:
            reply = json.loads(self.flwr("list", self.name, "--format", "json").stdout)
        except json.JSONDecodeError:
            return {}
        return {int(r["run-id"]): str(r.get("status")) for r in reply.get("runs", [])}

    def wait_online(self, count: int, timeout: float = 180) -> dict[int, str]:
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.nodes()
            if sum(s == "online" for s in nodes.values()) >= count:
                return nodes
            if time.monotonic() > deadline:
                raise TimeoutError(f"{nodes} after {timeout:.0f}s; superlink log:\n"
                                   f"{self.logs('superlink')[-3000:]}")
            time.sleep(2.0)

    def run(self, run_config: dict[str, Any], timeout: float = 900,
            stream_to: TextIO | None = None) -> RunOutcome:
        """``flwr run`` of this checkout from the host; the status from ``flwr list``."""
        return flwr_run(self, run_config, timeout=timeout, stream_to=stream_to)

    def run_dir(self, run_id: int) -> Path:
        """Where the ServerApp's results land on the host ($FEDOWEN_OUTPUT=/outputs)."""
        return self.outputs / f"run-{run_id}"
