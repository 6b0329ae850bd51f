"""The federation in real containers: docker/compose.yml up, FedOwen runs, and three faults.

Opt-in (marker ``docker``; neither ``scripts/test.sh`` mode selects it) and skipped unless
dockerd answers. The images come from ``scripts/docker-images.sh`` (run here when missing, so
the first run includes the build). One compose project serves the module, in this order:

1. a SuperLink with TLS and SuperNode authentication, the key registration, the Fleet gateway,
   three SuperNodes (own partition and client id each) and their SuperExecs; ``flwr run`` from
   the host completes 2 rounds of FedOwen; rounds.jsonl, ledger.csv and plots land on the host;
2. a SuperNode container killed after round 1: round 2 goes on without it; started again, it
   rejoins under the same node id and trains in round 3;
3. the SuperLink container restarted in the middle of a run: registered nodes (same ids),
   finished runs and the run in progress survive in its database volume; the SuperNodes and the
   ServerApp reconnect, and the run completes both rounds with every site;
4. a SuperNode container whose key was never registered is refused and exits with status 1.

    python -m pytest -m docker tests/test_docker_deployment.py -v -s   # -s: the timing lines
"""

from __future__ import annotations

import csv
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server_app.store.records import read_rounds
from tests.compose_federation import (
    APP_DIR,
    SITES,
    ComposeFederation,
    chown_tree,
    docker_up,
)
from tests.test_deployment import REFUSED_LINK_LOG, REFUSED_NODE_LOG

pytestmark = pytest.mark.docker
FLWR_VERSION = "1.42.0"
# Small data, so a round is mostly process start-up (a ClientApp process per message, importing
# torch); the timeouts bound what a dead node costs and leave room on a loaded machine.
SMALL = {"client-max-samples": 100, "test-max-samples": 500, "clients-per-round": len(SITES),
         "round-timeout": 300.0, "node-wait-timeout": 120.0}
STARTED = time.monotonic()


def note(message: str) -> None:
    """One line of the test's log (docs/results/docker-e2e.log keeps a run of it)."""
    print(f"[docker-e2e {time.monotonic() - STARTED:6.0f}s] {message}", flush=True)


@pytest.fixture(scope="module")
def federation(shared_data_dir: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[ComposeFederation]:
    reason = docker_up()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    build = subprocess.run(["bash", str(APP_DIR / "scripts" / "docker-images.sh"), "all"],
                           capture_output=True, text=True, timeout=3600, check=False)
    assert build.returncode == 0, build.stderr[-4000:]
    note(f"images ready in {time.monotonic() - started:.0f}s:\n{build.stdout.strip()}")
    fed = ComposeFederation(tmp_path_factory.mktemp("compose"), shared_data_dir)
    started = time.monotonic()
    try:
        fed.up()
        registered = fed.logs("register-supernodes")
        nodes = fed.wait_online(len(SITES))
        note(f"up: {len(nodes)} SuperNodes online in {time.monotonic() - started:.0f}s "
             f"(compose {' '.join(fed.compose('version', check=False).stdout.split()[:4])})")
        assert all(f"registered {s}" in registered for s in SITES), registered
        yield fed
    finally:
        fed.down()
        note(f"down; every service's log was in {fed.work / 'compose.log'}")


def _timed_run(fed: ComposeFederation, rounds: int, label: str) -> tuple[int, Path]:
    started = time.monotonic()
    with (fed.work / f"{label}.log").open("w") as log:
        outcome = fed.run({**SMALL, "num-server-rounds": rounds}, stream_to=log)
    note(f"{label}: run {outcome.run_id} {outcome.status} in {time.monotonic() - started:.0f}s")
    assert outcome.ok and outcome.run_id, outcome.output[-4000:]
    return outcome.run_id, fed.run_dir(outcome.run_id)


def test_two_rounds_of_fedowen_with_tls_and_node_auth(federation: ComposeFederation) -> None:
    # Execute
    _, out = _timed_run(federation, 2, "two-rounds")
    # Assert: the ServerApp's results are on the host, every site trained in every round
    rounds = read_rounds(out)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(sorted(r["returned"]) == SITES for r in rounds[1:]), rounds
    with (out / "ledger.csv").open() as fh:
        ledger = list(csv.DictReader(fh))
    assert {row["client_id"] for row in ledger} == set(SITES)
    for name in ("summary.json", "final_model.pt", "plots/accuracy.png", "plots/payouts.png"):
        assert (out / name).is_file(), f"{name} missing in {sorted(out.rglob('*'))}"
    note(f"results on the host: {sorted(p.name for p in out.iterdir())}; round seconds "
         f"{[round(r['round_seconds']) for r in rounds[1:]]}, test accuracy "
         f"{rounds[-1]['test_accuracy']:.3f}")


def _wait_for_round(out_parent: Path, before: set[str], n: int, timeout: float
                    ) -> dict[str, Any]:
    """Round ``n``'s record of the run whose output folder appeared after ``before``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run_dir in out_parent.glob("run-*"):
            if run_dir.name in before or not (run_dir / "rounds.jsonl").is_file():
                continue
            found = [r for r in read_rounds(run_dir) if r["round"] == n]
            if found:
                return found[0]
        time.sleep(1.0)
    raise TimeoutError(f"round {n} not recorded after {timeout:.0f}s")


def test_killed_supernode_round_goes_on_and_it_rejoins(federation: ComposeFederation) -> None:
    # Prepare: a 3-round run in the background
    fed, victim = federation, "supernode-1"
    ids_before = fed.nodes()
    before = {p.name for p in fed.outputs.glob("run-*")}
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(run=_timed_run(fed, 3, "kill")))
    runner.start()
    # Execute: kill site-1's SuperNode once round 1 is recorded; start it once round 2 is
    _wait_for_round(fed.outputs, before, 1, timeout=600)
    fed.compose("kill", victim)
    killed_at = time.monotonic()
    note(f"killed {victim} (site-1) after round 1")
    round2 = _wait_for_round(fed.outputs, before, 2, timeout=600)
    note(f"round 2 without it after {time.monotonic() - killed_at:.0f}s: returned "
         f"{round2['returned']}, failed {round2.get('failed')}")
    restarted_by_docker = fed.running(victim)
    fed.compose("start", victim)
    note(f"started {victim} again (docker had {'' if restarted_by_docker else 'not '}"
         "restarted it itself)")
    runner.join(timeout=900)
    # Assert
    assert "run" in result, "the run did not finish"
    rounds = read_rounds(result["run"][1])
    assert sorted(rounds[1]["returned"]) == SITES
    assert sorted(round2["returned"]) == ["site-0", "site-2"], round2
    assert sorted(rounds[3]["returned"]) == SITES, rounds[3]  # rejoined, same client id
    assert fed.nodes().keys() == ids_before.keys()  # and the same node id (its key)
    note(f"round 3: returned {rounds[3]['returned']}")


def _wait_finished(fed: ComposeFederation, run_id: int, timeout: float) -> str:
    """The run's final status from ``flwr list`` (the CLI's own stream may have broken)."""
    deadline = time.monotonic() + timeout
    status = "unknown"
    while time.monotonic() < deadline:
        status = fed.runs().get(run_id, "unknown")
        if status.startswith("finished"):
            return status
        time.sleep(5.0)
    return status


def test_superlink_restart_mid_run_keeps_nodes_runs_and_the_run(federation: ComposeFederation
                                                                 ) -> None:
    # Prepare: a 2-round run in the background
    fed = federation
    nodes, runs = fed.nodes(), fed.runs()
    assert runs and all(s == "finished:completed" for s in runs.values()), runs
    before = {p.name for p in fed.outputs.glob("run-*")}
    result: dict[str, Any] = {}
    log = (fed.work / "restart.log").open("w")
    runner = threading.Thread(target=lambda: result.update(outcome=fed.run(
        {**SMALL, "num-server-rounds": 2}, stream_to=log)))
    runner.start()
    # Execute: restart the SuperLink's container while round 1 is in progress
    _wait_for_round(fed.outputs, before, 0, timeout=600)
    started = time.monotonic()
    fed.compose("restart", "superlink")
    back = fed.wait_online(len(SITES))
    note(f"superlink restarted in round 1; {len(back)} SuperNodes online again after "
         f"{time.monotonic() - started:.0f}s")
    runner.join(timeout=900)
    log.close()
    run_id = result["outcome"].run_id
    status = _wait_finished(fed, run_id, timeout=900)
    broke = "SuperLink is unavailable" in " ".join(result["outcome"].output.split())
    note(f"run {run_id} {status} {time.monotonic() - started:.0f}s after the restart; the "
         f"operator's `flwr run --stream` {'broke off' if broke else 'went on'}")
    # Assert: the database volume kept the registered keys (same node ids), the finished runs
    # and the run in progress, whose ServerApp reconnected and finished both rounds
    assert back.keys() == nodes.keys()
    assert {k: v for k, v in fed.runs().items() if k in runs} == runs
    assert status == "finished:completed", result["outcome"].output[-3000:]
    rounds = read_rounds(fed.run_dir(run_id))
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(sorted(r["returned"]) == SITES for r in rounds[1:]), rounds


def test_unregistered_supernode_container_is_refused(federation: ComposeFederation) -> None:
    # Prepare: a key pair the operator never registered
    fed = federation
    keys = fed.work / "intruder"
    keys.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f",
                    str(keys / "node.key")], check=True)
    chown_tree(keys)
    nodes = fed.nodes()
    # Execute: the SuperNode image on the devices' network, as a device would run it
    started = time.monotonic()
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", fed.network("fleet"),
         "-v", f"{fed.certs / 'ca.crt'}:/certs/ca.crt:ro",
         "-v", f"{keys / 'node.key'}:/certs/node.key:ro", f"flwr/supernode:{FLWR_VERSION}",
         "--superlink", "fleet-gateway:8000", "--root-certificates", "/certs/ca.crt",
         "--auth-supernode-private-key", "/certs/node.key",
         "--node-config", 'partition-id=0 num-partitions=3 client-id="intruder"'],
        capture_output=True, text=True, timeout=180, check=False)
    note(f"unregistered SuperNode container exited with {proc.returncode} after "
         f"{time.monotonic() - started:.0f}s")
    # Assert
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert all(line in output for line in REFUSED_NODE_LOG), output
    assert REFUSED_LINK_LOG in fed.logs("superlink")
    assert fed.nodes().keys() == nodes.keys()  # nothing was added
    note(f"refused: {[line for line in output.splitlines() if 'code: 2004' in line]}")
