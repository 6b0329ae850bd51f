"""Beyond one machine, rehearsed on one: a Ray cluster of two nodes with 1 CPU each
(``ray.cluster_utils.Cluster``: a head and a worker node, each its own raylet).

A ``flwr run`` whose SuperLink has ``RAY_ADDRESS`` in its environment attaches Flower's Ray
backend to the cluster, and its clients run on both nodes (each reply names its Ray node; the
round records list them as ``ray_nodes``). A sweep dispatched with ``--ray-address`` gives the
same records as the local runner, cell for cell; a cell that fails is retried once and marked
failed; a wrong address fails in seconds, naming the ``ray start`` command. The cluster lives
under its own temporary folder (``RAY_TMPDIR``: a plain ``ray.init()`` elsewhere on the machine
must not find it) and is shut down after the module, also when a test failed; the last check
is that none of its processes (raylets, GCS, workers) is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedowen_deploy.launcher import APP_DIR, LocalSuperLink, flwr_run, free_port
from server_app.store.records import read_rounds
from sim.cell_state import STATE_FILE
from tests.test_behaviour_guard import without_seconds

TINY = {"dataset": "mnist", "num-server-rounds": 2, "client-max-samples": 50,
        "test-max-samples": 300}


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    """A head and one worker node, 1 CPU each: ``address``, ``node_ids``, ``folder``."""
    pytest.importorskip("ray.cluster_utils")
    from sim.local_cluster import local_cluster, processes_mentioning

    with local_cluster(nodes=2, cpus_per_node=1) as info:  # shuts down on errors too
        yield {**info, "node_ids": set(info["node_ids"])}
    # local_cluster raised if any process of the cluster was left; checked again here
    assert not [p for p in processes_mentioning(info["folder"]) if "raylet" in p]


def write_preset(path: Path, name: str, axes: dict[str, list[Any]]) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps({
        "preset": {"name": name, "num-supernodes": 4, "cell-timeout": 300,
                   "backend": "inline"},
        "base": {**TINY, "clients-per-round": 2},
        "grid": [{"name": "t", "axes": axes}]}))
    return path


def experiments(*args: str, timeout: float = 170) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(APP_DIR)}
    return subprocess.run([sys.executable, "-m", "sim.experiments", "run", *args],
                          cwd=APP_DIR, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def without_timing(out: Path) -> list[dict[str, Any]]:
    """A run's records without wall-clock fields (at any depth: the selection's too)."""
    return [without_seconds(r) for r in read_rounds(out)]


@pytest.mark.e2e
def test_flwr_run_on_the_cluster_trains_clients_on_both_nodes(
        cluster: dict[str, Any], shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: a SuperLink whose simulation attaches to the cluster
    out = tmp_path / "out"
    cfg = {**TINY, "clients-per-round": 4, "data-dir": str(shared_data_dir),
           "output-dir": str(out)}
    # Execute
    with LocalSuperLink(tmp_path / "flwr-home", env={"RAY_ADDRESS": cluster["address"]}) \
            as link:
        outcome = flwr_run(link, cfg, num_supernodes=4, cpus_per_client=1, timeout=240)
    # Assert: completed; every returned client of both rounds was run on one of the two
    # nodes, and both nodes ran clients (one actor per 1-CPU node)
    assert outcome.ok, f"run ended {outcome.status}:\n{outcome.output[-3000:]}"
    rounds = read_rounds(out)[1:]
    assert len(rounds) == 2
    for record in rounds:
        placed = sorted(c for ids in record["ray_nodes"].values() for c in ids)
        assert placed == sorted(record["returned"]) and len(placed) == 4
        assert set(record["ray_nodes"]) <= cluster["node_ids"]
    assert {node for r in rounds for node in r["ray_nodes"]} == cluster["node_ids"]


@pytest.mark.e2e
def test_a_sweep_on_the_cluster_matches_the_local_runner_cell_for_cell(
        cluster: dict[str, Any], shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: 4 cells (2 methods x 2 seeds), 2 rounds each
    preset = write_preset(tmp_path / "tiny.toml", "tiny-cluster",
                          {"seed": [0, 1], "valuation": ["owen", "none"]})
    data = ["--data-dir", str(shared_data_dir)]
    # Execute: locally (2 processes), then as Ray tasks on the cluster
    local = experiments(str(preset), "--results", str(tmp_path / "local"), "--jobs", "2", *data)
    remote = experiments(str(preset), "--results", str(tmp_path / "cluster"),
                         "--ray-address", cluster["address"], *data)
    # Assert: both finished every cell; the cluster's progress names the node of each cell
    # and both nodes ran cells; records and ledgers are identical but for timings
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    assert remote.returncode == 0, remote.stdout[-3000:] + remote.stderr[-3000:]
    assert "2 nodes, 2 CPUs" in remote.stdout and "2 cells at a time" in remote.stdout
    finished = [line for line in remote.stdout.splitlines() if "] done on node " in line]
    assert len(finished) == 4
    assert {nid[:8] for nid in cluster["node_ids"]} == {
        line.rsplit("(", 1)[1][:8] for line in finished}
    cells = sorted(p.name for p in (tmp_path / "local").iterdir()
                   if (p / "summary.json").is_file())
    assert len(cells) == 4
    for cell in cells:
        a, b = tmp_path / "local" / cell, tmp_path / "cluster" / cell
        assert without_timing(b) == without_timing(a), f"cell {cell} differs"
        assert len(read_rounds(b)) == 3 and (b / "summary.json").is_file()
        assert (b / "ledger.csv").read_text() == (a / "ledger.csv").read_text()
    # a second invocation finds every cell done and runs none
    again = experiments(str(preset), "--results", str(tmp_path / "cluster"),
                        "--ray-address", cluster["address"], *data)
    assert again.returncode == 0 and "'done': 4" in again.stdout
    assert "done on node" not in again.stdout


def test_a_sweep_whose_cells_cannot_split_their_data_stops_before_any_task(
        cluster: dict[str, Any], shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: BreastMNIST's 546 images cannot make 100 clients of 10 (the local run's check)
    import tomli_w

    preset = tmp_path / "unfit.toml"
    preset.write_text(tomli_w.dumps({
        "preset": {"name": "unfit", "num-supernodes": 100, "backend": "inline"},
        "base": {"num-server-rounds": 1, "valuation": "none"},
        "grid": [{"name": "g", "axes": {"seed": [0], "dataset": ["mnist", "medmnist"]}}]}))
    # Execute
    done = experiments(str(preset), "--results", str(tmp_path / "res"), "--ray-address",
                       cluster["address"], "--data-dir", str(shared_data_dir))
    # Assert: the count and the reason, as a local run says them, and no task ran
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 of 2 cells cannot split their data among num-supernodes = 100" in done.stderr
    assert "nothing ran" in done.stderr and "done on node" not in done.stdout


@pytest.mark.e2e
def test_a_failing_cell_on_the_cluster_is_retried_once_then_marked_failed(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    # Prepare: a data dir without MNIST: the cell's process fails on every node
    preset = write_preset(tmp_path / "bad.toml", "bad-cell",
                          {"seed": [0], "valuation": ["owen"]})
    empty = tmp_path / "no-data"
    empty.mkdir()
    # Execute
    done = experiments(str(preset), "--results", str(tmp_path / "res"),
                       "--ray-address", cluster["address"], "--data-dir", str(empty))
    # Assert: exit 1, two attempts reported (progress and cells.jsonl), then failed
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "attempt 1 failed" in done.stdout and "attempt 2 failed" in done.stdout
    events = [json.loads(line) for line in
              (tmp_path / "res" / STATE_FILE).read_text().splitlines()]
    assert [e["event"] for e in events] == ["error", "error", "failed"]
    assert "ran on node" in events[0]["log_tail"]


def test_a_wrong_address_fails_fast_naming_the_ray_start_command(tmp_path: Path) -> None:
    # Prepare: a port on which nothing listens
    preset = write_preset(tmp_path / "p.toml", "p", {"seed": [0], "valuation": ["none"]})
    port = free_port()
    # Execute
    started = time.monotonic()
    done = experiments(str(preset), "--results", str(tmp_path / "res"),
                       "--ray-address", f"127.0.0.1:{port}", timeout=60)
    # Assert
    assert done.returncode == 2 and time.monotonic() - started < 30
    assert f"--ray-address 127.0.0.1:{port}" in done.stderr
    assert f"ray start --head --port={port}" in done.stderr
    assert not (tmp_path / "res").exists()


# ---------------------------------------------------------------- without a cluster

@pytest.mark.parametrize(("address", "command"), [
    ("127.0.0.1:6379", "ray start --head --port=6379"),
    ("10.0.0.5:6380", "ray start --head --node-ip-address=10.0.0.5 --port=6380"),
    ("ray://10.0.0.5:10001", "ray start --head --node-ip-address=10.0.0.5 "
                             "--ray-client-server-port=10001"),
    ("auto", "ray start --head")])
def test_the_ray_start_command_that_makes_each_address(address: str, command: str) -> None:
    from sim.cluster import ray_start_command

    assert ray_start_command(address) == command


def test_cell_files_travel_whole_and_stay_inside_their_folder(tmp_path: Path) -> None:
    from sim.cluster_task import pack, unpack

    # Prepare
    src = tmp_path / "src"
    (src / "plots").mkdir(parents=True)
    (src / "rounds.jsonl").write_text('{"round": 0}\n')
    (src / "plots" / "a.png").write_bytes(b"\x89PNG")
    (src / "flwr.log").write_text("the driver's log")
    # Execute
    files = pack(src)
    unpack(files, tmp_path / "dst")
    # Assert: everything but the driver's own log, byte for byte; no path may leave
    assert sorted(files) == ["plots/a.png", "rounds.jsonl"]
    assert (tmp_path / "dst" / "plots" / "a.png").read_bytes() == b"\x89PNG"
    assert pack(tmp_path / "missing") == {}
    with pytest.raises(ValueError, match="would leave"):
        unpack({"../evil": b""}, tmp_path / "dst")


def test_slots_count_the_cells_each_node_fits() -> None:
    from sim.cluster import ClusterSession

    nodes = [{"CPU": 4.0}, {"CPU": 16.0, "GPU": 2.0}, {"CPU": 1.0}]
    assert ClusterSession("x", nodes, cell_cpus=1).slots == 21
    assert ClusterSession("x", nodes, cell_cpus=2).slots == 10
    assert ClusterSession("x", nodes, cell_cpus=1, cell_gpus=1).slots == 2
    assert ClusterSession("x", nodes, cell_cpus=1, cell_gpus=0.5).slots == 4


def test_replies_name_their_ray_node_only_inside_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.app import Message, RecordDict

    from client_app import app as client
    from fedowen_strategy.replies import ray_nodes

    class FakeRay:
        def __init__(self, node: str) -> None:
            self.node = node

        def is_initialized(self) -> bool:
            return True

        def get_runtime_context(self) -> Any:
            return type("Ctx", (), {"get_node_id": lambda _self: self.node})()

    def reply(client_id: str) -> Message:
        return Message(client._named(RecordDict(), client_id), dst_node_id=1,
                       message_type="train")

    # Execute: outside Ray, then in two Ray nodes
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    outside = [reply("0")]
    monkeypatch.setitem(sys.modules, "ray", FakeRay("node-b"))
    inside = [reply("2"), reply("10")]
    monkeypatch.setitem(sys.modules, "ray", FakeRay("node-a"))
    inside.append(reply("1"))
    # Assert
    assert ray_nodes(outside) == {}
    assert "ray-node" not in outside[0].content.config_records["client"]
    assert ray_nodes(outside + inside) == {"node-a": ["1"], "node-b": ["10", "2"]}
