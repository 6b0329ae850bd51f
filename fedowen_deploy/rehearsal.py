"""A real deployment on one machine: TLS SuperLink, authenticated SuperNodes, ``flwr run``.

This is the loopback rehearsal of ``docs/deployment.md``: the same binaries and flags as on
separate machines, only every address is 127.0.0.1 and every port is free. The SuperLink
serves its Control, Fleet and Runtime APIs on one TLS port (flwr 1.41-1.42) and admits only
SuperNodes whose public keys were registered with ``flwr supernode register``; each SuperNode
runs its ClientApps in subprocesses from this venv (no runtime dependency installation).

Every process is started in its own session and stopped by its pid (its process group, then
any descendant that left the group) when the :class:`SecureSuperLink` context exits, also on
errors and on SIGTERM/SIGINT (:mod:`fedowen_deploy.procs`). ``python -m
fedowen_deploy.rehearsal`` runs the rehearsal from the command line.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import tomli_w

from fedowen_deploy.launcher import APP_DIR, BIN, flower_env, flwr_run, free_port
from fedowen_deploy.procs import exit_on_signals, stop_tree
from server_app.config import RunConfig

MAKE_CERTS = APP_DIR / "scripts" / "make-certs.sh"


def make_certs(out_dir: Path, num_nodes: int, prefix: str = "site-") -> Path:
    """CA, SuperLink certificate and ``num_nodes`` SuperNode key pairs via make-certs.sh."""
    proc = subprocess.run(["bash", str(MAKE_CERTS), "-d", str(out_dir), "-n", str(num_nodes),
                           "-p", prefix], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{MAKE_CERTS} failed ({proc.returncode}): {proc.stderr.strip()}")
    return out_dir


@dataclass
class ManagedProcess:
    """A Flower process started in its own session, its output in ``log_file``."""

    name: str
    process: subprocess.Popen[bytes]
    log_file: Path

    @classmethod
    def start(cls, name: str, cmd: list[str], env: dict[str, str], log_file: Path
              ) -> ManagedProcess:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("wb") as sink:
            proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(name, proc, log_file)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def wait_for_exit(self, timeout: float) -> int | None:
        """The exit status, or None when still running after ``timeout`` seconds."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process, its group and every descendant (Flower detaches some, e.g. the
        SuperLink's SuperExec); SIGKILL whatever is left after ``grace`` seconds."""
        stop_tree(self.process, grace)


@dataclass
class SecureSuperLink:
    """A deployment SuperLink with TLS and SuperNode authentication (a context manager).

    The SuperLink listens on loopback ``port`` (the operator's Control API); SuperNodes reach
    it through the Fleet-only gateway on ``fleet_port`` (:mod:`fedowen_deploy.gateway`), as on a
    server
    whose devices' network must not reach the Control API. Writes ``$FLWR_HOME/config.toml``
    with a ``[superlink.<name>]`` entry that trusts the CA, so ``flwr run``, ``flwr list`` and
    ``flwr supernode ...`` talk to it (the operator's address) over TLS.
    """

    flwr_home: Path
    certs: Path
    name: str = "fedowen-deploy"
    port: int = 0
    fleet_port: int = 0
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def address(self) -> str:
        """The operator's address: Control API (and Fleet, Runtime) of the SuperLink itself."""
        return f"127.0.0.1:{self.port}"

    @property
    def fleet_address(self) -> str:
        """The devices' address: the Fleet-only gateway (:mod:`fedowen_deploy.gateway`)."""
        return f"127.0.0.1:{self.fleet_port}"

    @property
    def env(self) -> dict[str, str]:
        return flower_env(self.flwr_home)

    def __enter__(self) -> SecureSuperLink:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        c = self.certs
        cmd = [str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(c / "ca.crt"),
               "--ssl-certfile", str(c / "superlink.crt"),
               "--ssl-keyfile", str(c / "superlink.key"), "--enable-supernode-auth",
               "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
               "--port", str(self.port), "--database", str(self.flwr_home / "state.db")]
        self.fleet_port = self.fleet_port or free_port()
        gateway = [str(BIN / "python"), "-m", "fedowen_deploy.gateway",
                   "--listen", self.fleet_address, "--upstream", f"https://{self.address}",
                   "--ssl-certfile", str(c / "superlink.crt"),
                   "--ssl-keyfile", str(c / "superlink.key"), "--ca-certfile", str(c / "ca.crt")]
        try:
            link = ManagedProcess.start("superlink", cmd, self.env,
                                        self.flwr_home / "logs" / "superlink.log")
            self.processes.append(link)
            _wait_listening(link, self.port, timeout=60)
            fleet = ManagedProcess.start("gateway", gateway, {**self.env, "PYTHONPATH": str(
                APP_DIR)}, self.flwr_home / "logs" / "gateway.log")
            self.processes.append(fleet)
            _wait_listening(fleet, self.fleet_port, timeout=60)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        (self.flwr_home / "config.toml").write_text(tomli_w.dumps({"superlink": {
            "default": self.name,
            self.name: {"address": self.address, "root-certificates": str(c / "ca.crt")}}}))
        return self

    def __exit__(self, *exc: object) -> None:
        # SuperNodes first (they would retry against a vanished SuperLink), SuperLink last.
        for proc in reversed(self.processes):
            proc.stop()

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the ``flwr`` CLI against this SuperLink's ``FLWR_HOME``."""
        return subprocess.run([str(BIN / "flwr"), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def register(self, *public_keys: Path) -> dict[str, int]:
        """``flwr supernode register`` each key (concurrently); returns name -> node id."""
        procs = {key.stem: subprocess.Popen(
            [str(BIN / "flwr"), "supernode", "register", str(key), self.name, "--name", key.stem,
             "--format", "json"], env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for key in public_keys}
        node_ids: dict[str, int] = {}
        for stem, proc in procs.items():
            out, err = proc.communicate(timeout=60)
            reply = _json_or_empty(out)
            if not reply.get("success"):
                raise RuntimeError(f"registering {stem} failed: {reply or err.strip()}")
            node_ids[stem] = int(reply["node-id"])
        return node_ids

    def online_nodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list``: the registered nodes whose status is ``online``."""
        reply = _json_or_empty(self.flwr("supernode", "list", self.name, "--format",
                                         "json").stdout)
        return [n for n in reply.get("nodes", []) if n.get("status") == "online"]

    def start_supernode(self, name: str, private_key: Path, node_config: str
                        ) -> ManagedProcess:
        """A ``flower-supernode`` that authenticates with ``private_key``."""
        cmd = [str(BIN / "flower-supernode"), "--superlink", self.fleet_address,
               "--root-certificates", str(self.certs / "ca.crt"),
               "--auth-supernode-private-key", str(private_key),
               "--node-config", node_config, "--host", "127.0.0.1", "--port", str(free_port())]
        proc = ManagedProcess.start(name, cmd, self.env,
                                    self.flwr_home / "logs" / f"{name}.log")
        self.processes.append(proc)
        return proc

    def wait_online(self, count: int, timeout: float = 60) -> list[dict[str, Any]]:
        """Poll until at least ``count`` SuperNodes are online; raise with the logs if not."""
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.online_nodes()
            if len(nodes) >= count:
                return nodes
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {p.name}\n{p.log_text()[-1500:]}"
                                  for p in self.processes)
                raise TimeoutError(f"{len(nodes)}/{count} SuperNodes online after "
                                   f"{timeout:.0f}s\n{tails}")
            time.sleep(1.0)


def node_config(partition_id: int, num_partitions: int, client_id: str) -> str:
    """The ``--node-config`` string of one SuperNode (string values in TOML double quotes)."""
    return (f'partition-id={partition_id} num-partitions={num_partitions} '
            f'client-id="{client_id}"')


def _json_or_empty(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _wait_listening(proc: ManagedProcess, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.process.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.process.returncode}:\n"
                               f"{proc.log_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), 0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{proc.name} not listening on {port} after {timeout:.0f}s; "
                       f"see {proc.log_file}")


def rehearse(work_dir: Path, num_nodes: int, run_config: dict[str, Any],
             stream_to: IO[str] | None = None) -> int:
    """Certificates, SuperLink, ``num_nodes`` registered SuperNodes, one ``flwr run``. Each
    rehearsal starts the SuperLink from an empty state (an earlier one's registered keys
    would refuse this one's registrations: "Public key already in use")."""
    certs = make_certs(work_dir / "certs", num_nodes)
    for old in (work_dir / "flwr-home").glob("state.db*"):
        old.unlink()
    with SecureSuperLink(work_dir / "flwr-home", certs) as link:
        keys = [certs / "supernodes" / f"site-{i}" for i in range(num_nodes)]
        link.register(*(k.with_suffix(".pub") for k in keys))
        for i, key in enumerate(keys):
            link.start_supernode(key.name, key, node_config(i, num_nodes, key.name))
        link.wait_online(num_nodes)
        outcome = flwr_run(link, run_config, timeout=3600, stream_to=stream_to)
    print(f"run {outcome.run_id}: {outcome.status}", file=sys.stderr)
    return 0 if outcome.ok else 1


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m fedowen_deploy.rehearsal --work-dir DIR --nodes 3 --set
    num-server-rounds=2``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path(".flwr-home/deploy"),
                        help="certificates, FLWR_HOME and logs go here")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="run config override (TOML value), repeatable")
    args = parser.parse_args(argv)
    run_config = rehearsal_config(args.set, args.nodes)
    with exit_on_signals():  # SIGTERM/SIGINT: every process started is stopped on the way out
        return rehearse(args.work_dir.resolve(), args.nodes, run_config, stream_to=sys.stdout)


def rehearsal_config(sets: list[str], num_nodes: int) -> dict[str, Any]:
    """The run config of ``--set KEY=VALUE`` items. A rehearsal's nodes are all the
    federation there is, so ``clients-per-round`` is at most their number unless set (the
    default round of 10 would wait for nodes that never come)."""
    run_config: dict[str, Any] = {}
    for item in sets:
        key, _, raw = item.partition("=")
        run_config.update(_toml_value(key.strip(), raw.strip()))
    run_config.setdefault("clients-per-round", min(num_nodes, RunConfig().clients_per_round))
    return run_config


def _toml_value(key: str, raw: str) -> dict[str, Any]:
    import tomllib

    try:
        return tomllib.loads(f'"{key}" = {raw}')
    except tomllib.TOMLDecodeError:
        return {key: raw}  # a bare word: a string


if __name__ == "__main__":
    sys.exit(main())
