"""Device-sized SuperNodes in containers: docker/compose.edge.yml over compose.yml (issue 63).

Opt-in (marker ``docker``, like ``tests/test_docker_deployment.py``) and skipped unless dockerd
answers. ``ARCHS="amd64 arm64" scripts/docker-images.sh`` makes the images when missing (the
arm64 ones under qemu: the first run includes that build). Two nodes with a Raspberry-Pi-like
budget join the amd64 SuperLink with TLS and SuperNode authentication through the Fleet
gateway: each node's SuperNode and ClientApp SuperExec share one CPU core, the SuperExec is
limited to 1 GB of memory and the SuperNode to 256 MB. ``edge-0`` is amd64; ``edge-1``'s
SuperNode and its ClientApps are arm64 under emulation (qemu-user 10 from bookworm-backports:
Debian bookworm's own 7.2 segfaults in torch 2.14.1's aarch64 build, docs/deployment.md).
2 rounds of FedOwen; per node the test records its containers' peak memory and OOM kills, the
seconds from a train message's arrival to its reply, and the bytes its SuperNode sent and
received on the Fleet link. Both rounds must aggregate with edge-1's update accepted. Then
edge-0's SuperExec is cut to 256 MB: the kernel
kills its ClientApp, and the round goes on with edge-1, edge-0 recorded as a failed client.

    python -m pytest -m docker tests/test_docker_edge.py -v -s   # docs/results/docker-edge.log
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from server_app.store.records import read_rounds
from tests.compose_federation import (
    APP_DIR,
    COMPOSE_FILE,
    EDGE_FILE,
    ComposeFederation,
    docker_up,
)

pytestmark = pytest.mark.docker
EDGE_SITES = ("edge-0", "edge-1")
ARCH = {"edge-0": "amd64", "edge-1": "arm64"}  # of each node's SuperNode
# edge-1's ClientApps in the arm64 app image, under qemu-user 10 (bookworm-backports; 7.2
# segfaulted in torch's aarch64 build): set these to run them in the amd64 image instead
CLIENTAPP_ENV: dict[str, str] = {}
SERVER = ("superlink", "superexec-serverapp", "register-supernodes", "fleet-gateway")
NODES = {site: (f"supernode-{site}", f"superexec-clientapp-{site}") for site in EDGE_SITES}
# Small data; a round is mostly ClientApp processes importing torch (under qemu for edge-1)
SMALL = {"client-max-samples": 100, "test-max-samples": 500, "clients-per-round": 2,
         "round-timeout": 1200.0, "node-wait-timeout": 600.0, "num-server-rounds": 2}
OOM_LIMIT = "256m"  # below what a ClientApp importing torch needs (about 700-800 MB peak)
STARTED = time.monotonic()


def note(message: str) -> None:
    """One line of the test's log (docs/results/docker-edge.log keeps a run of it)."""
    print(f"[docker-edge {time.monotonic() - STARTED:6.0f}s] {message}", flush=True)


@pytest.fixture(scope="module")
def edge(shared_data_dir: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[ComposeFederation]:
    reason = docker_up()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    script = str(APP_DIR / "scripts" / "docker-images.sh")
    for step, archs in (("flower", "amd64 arm64"), ("app", "amd64 arm64"), ("sizes", "amd64")):
        build = subprocess.run(["bash", script, step], env={**os.environ, "ARCHS": archs},
                               capture_output=True, text=True, timeout=7200, check=False)
        assert build.returncode == 0, build.stderr[-4000:]
    note(f"images ready in {time.monotonic() - started:.0f}s:\n{build.stdout.strip()}")
    fed = ComposeFederation(tmp_path_factory.mktemp("edge"), shared_data_dir,
                            project="fedowen-edge-e2e", files=(COMPOSE_FILE, EDGE_FILE),
                            key_prefix="edge-", sites=EDGE_SITES,
                            services=(*SERVER, *(s for pair in NODES.values() for s in pair)),
                            extra_env=CLIENTAPP_ENV)
    started = time.monotonic()
    try:
        fed.up()
        nodes = fed.wait_online(len(EDGE_SITES), timeout=900)
        note(f"up: {len(nodes)} device-sized SuperNodes online in "
             f"{time.monotonic() - started:.0f}s")
        yield fed
    finally:
        fed.down()
        note(f"down; every service's log was in {fed.work / 'compose.log'}")


def inspect(fed: ComposeFederation, service: str, fmt: str) -> str:
    return subprocess.run(["docker", "inspect", "-f", fmt, fed.container(service)],
                          capture_output=True, text=True, check=True).stdout.strip()


def image_arch(image_id: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "-f", "{{.Architecture}}", image_id],
                          capture_output=True, text=True, check=True).stdout.strip()


def cgroup_memory(fed: ComposeFederation, service: str) -> dict[str, int]:
    """Peak memory (bytes) and OOM kills of a service's container (cgroup v1 or v2)."""
    cid = inspect(fed, service, "{{.Id}}")
    # (folder, peak file, the file that counts OOM kills): cgroup v1 (cgroupfs), then v2
    layouts = [(Path(f"/sys/fs/cgroup/memory/docker/{cid}"), "memory.max_usage_in_bytes",
                "memory.oom_control"),
               (Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope"), "memory.peak",
                "memory.events")]
    for base, peak, events in layouts:
        if base.is_dir():
            kills = re.search(r"oom_kill (\d+)", (base / events).read_text())
            return {"peak": int((base / peak).read_text()),
                    "oom_kills": int(kills.group(1)) if kills else 0}
    raise RuntimeError(f"no memory cgroup for {service} ({cid}) under /sys/fs/cgroup")


def net_bytes(fed: ComposeFederation, service: str) -> dict[str, int]:
    """Bytes the container received and sent on its one interface, eth0."""
    out = {}
    for key in ("rx", "tx"):
        out[key] = int(subprocess.run(
            ["docker", "exec", fed.container(service), "cat",
             f"/sys/class/net/eth0/statistics/{key}_bytes"],
            capture_output=True, text=True, check=True, timeout=120).stdout)
    return out


def timestamped_log(fed: ComposeFederation, service: str) -> str:
    proc = subprocess.run(["docker", "logs", "--timestamps", fed.container(service)],
                          capture_output=True, text=True, check=True)
    return proc.stdout + proc.stderr


def train_seconds(log: str, run_id: int) -> list[float]:
    """Seconds from each ``Receiving: train message`` of run ``run_id`` to the next ``Sending:
    train message`` in a SuperNode's log (``docker logs --timestamps``), in order: one a round
    for a node selected every round. They cover the ClientApp process's start, torch's import,
    the data and the training, as the device sees them."""
    seconds, run, received = [], None, None
    for line in log.splitlines():
        head = re.search(r"\[RUN (\d+)", line)
        if head:
            run = int(head.group(1))
            continue
        event = re.search(r"(Receiving|Sending): train message", line)
        if event and run == run_id:
            stamp = datetime.fromisoformat(line.split()[0][:26].rstrip("Z"))
            if event.group(1) == "Receiving":
                received = stamp
            elif received is not None:
                seconds.append(round((stamp - received).total_seconds(), 1))
                received = None
    return seconds


def test_device_sized_nodes_train_two_rounds_with_an_arm64_node(edge: ComposeFederation
                                                               ) -> None:
    # Prepare: each node's images and limits as compose made them; its counters before the run
    fed = edge
    for site, (node, exec_) in NODES.items():
        archs = [image_arch(inspect(fed, s, "{{.Image}}")) for s in (node, exec_)]
        limits = [inspect(fed, s, "{{.HostConfig.Memory}} {{.HostConfig.CpusetCpus}}")
                  for s in (node, exec_)]
        note(f"{site}: SuperNode, SuperExec architectures {archs}, (memory bytes, cpuset) "
             f"{limits}")
        assert archs[0] == ARCH[site]
    before = {s: net_bytes(fed, s) for pair in NODES.values() for s in pair}

    # Execute
    started = time.monotonic()
    with (fed.work / "edge-run.log").open("w") as log:
        outcome = fed.run(SMALL, timeout=3600, stream_to=log)
    note(f"run {outcome.run_id} {outcome.status} in {time.monotonic() - started:.0f}s")

    # Assert: both rounds aggregated, the arm64 node's update accepted in each
    assert outcome.ok and outcome.run_id, outcome.output[-4000:]
    rounds = read_rounds(fed.run_dir(outcome.run_id))
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        note(f"round {r['round']}: {r['round_seconds']:.0f}s, returned {r.get('returned')}, "
             f"failed {r.get('failed') or {}}, rejected {r.get('rejected') or {}}")
    assert all("edge-1" in r["returned"] and "edge-1" not in (r.get("rejected") or {})
               for r in rounds[1:]), rounds

    # Record: per node, the numbers docs/deployment.md reports
    summary: dict[str, Any] = {}
    for site, (node, exec_) in NODES.items():
        after = {s: net_bytes(fed, s) for s in (node, exec_)}
        delta = {s: {k: after[s][k] - before[s][k] for k in ("rx", "tx")} for s in after}
        summary[site] = {
            "arch": ARCH[site],
            "memory": {s: cgroup_memory(fed, s) for s in (node, exec_)},
            "train_seconds": train_seconds(timestamped_log(fed, node), outcome.run_id),
            # the SuperNode's interface carries the Fleet link and its SuperExec's traffic;
            # the SuperExec talks to nobody else, so the Fleet link is the difference
            "fleet_bytes_received": delta[node]["rx"] - delta[exec_]["tx"],
            "fleet_bytes_sent": delta[node]["tx"] - delta[exec_]["rx"],
        }
        note(f"{site} ({ARCH[site]}): {json.dumps(summary[site])}")
    (fed.work / "edge-summary.json").write_text(json.dumps(summary, indent=2))
    for site, numbers in summary.items():
        assert numbers["train_seconds"], f"{site}: no train message in its SuperNode's log"
        assert numbers["fleet_bytes_received"] > 0 and numbers["fleet_bytes_sent"] > 0


def test_a_node_over_its_memory_limit_is_a_failed_client_and_the_round_goes_on(
        edge: ComposeFederation) -> None:
    # Prepare: edge-0's ClientApps get less memory than a torch process needs
    fed, (_, exec_) = edge, NODES["edge-0"]
    cid = fed.container(exec_)
    kills_before = cgroup_memory(fed, exec_)["oom_kills"]
    subprocess.run(["docker", "update", "--memory", OOM_LIMIT, "--memory-swap", OOM_LIMIT, cid],
                   capture_output=True, check=True)
    note(f"edge-0's SuperExec limited to {OOM_LIMIT}")
    # Execute: one round; a dead ClientApp costs the round its timeout
    started = time.monotonic()
    try:
        with (fed.work / "oom-run.log").open("w") as log:
            outcome = fed.run({**SMALL, "num-server-rounds": 1, "round-timeout": 180.0},
                              timeout=1800, stream_to=log)
    finally:
        subprocess.run(["docker", "update", "--memory", "1g", "--memory-swap", "1g", cid],
                       capture_output=True, check=False)
    kills = cgroup_memory(fed, exec_)["oom_kills"] - kills_before
    note(f"run {outcome.run_id} {outcome.status} in {time.monotonic() - started:.0f}s; "
         f"OOM kills in edge-0's SuperExec: {kills}")
    # Assert: the kernel killed edge-0's ClientApp, the round aggregated edge-1 alone and
    # records edge-0 as a failed client. Its key is node:<id>, not edge-0: the client-id query
    # of the run's start was killed too, so the ServerApp never learnt the node's client id
    assert outcome.ok and outcome.run_id, outcome.output[-4000:]
    record = read_rounds(fed.run_dir(outcome.run_id))[1]
    note(f"round 1: {record['round_seconds']:.0f}s, selected {record.get('selected')}, returned "
         f"{record.get('returned')}, failed {record.get('failed')}")
    assert kills >= 1
    failed = record.get("failed") or {}
    assert record["returned"] == ["edge-1"] and len(failed) == 1, record
    assert "edge-1" not in failed and "ClientApp stopped responding" in str(failed), record
