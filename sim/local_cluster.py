"""A Ray cluster of several nodes on one machine, for tests and benchmarks of the cluster paths
(``RAY_ADDRESS`` for ``flwr run``, ``--ray-address`` for sweeps).

Each node is its own raylet with its own resources (``ray.cluster_utils.Cluster``), so tasks
and actors really are placed on different nodes. The cluster lives in a temporary folder of its
own: ``RAY_TMPDIR`` points there while it runs, because Ray records the latest cluster's
address in ``$RAY_TMPDIR/ray/ray_current_cluster`` and a plain ``ray.init()`` elsewhere on
the machine (every Flower simulation) would otherwise attach to it, or, once it is gone, try
to. On exit, also after an error, the cluster is shut down and it is checked that none of its
processes is left.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def processes_mentioning(text: str) -> list[str]:
    """Command lines of the live processes (other than this one) that mention ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        if cmdline.parent.name == str(os.getpid()):
            continue
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args.strip())
    return found


def left_after(folder: str, wait: float = 20.0) -> list[str]:
    """The processes of the cluster in ``folder`` still alive after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while (left := processes_mentioning(folder)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@contextmanager
def local_cluster(nodes: int = 2, cpus_per_node: float = 1.0) -> Iterator[dict[str, Any]]:
    """Start ``nodes`` Ray nodes (a head and workers) with ``cpus_per_node`` CPUs each; yield
    ``address``, ``node_ids`` (head first) and ``folder``. Raises ``RuntimeError`` on exit
    when a process of the cluster outlived its shutdown."""
    from ray.cluster_utils import Cluster

    if nodes < 1:
        raise ValueError(f"nodes={nodes} must be >= 1")
    folder = tempfile.mkdtemp(prefix="fo-ray-", dir="/tmp")  # short: Ray's socket paths
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = folder
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": cpus_per_node, "include_dashboard": False})
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=cpus_per_node)
        cluster.wait_for_nodes()
        head = cluster.head_node
        assert head is not None  # initialize_head=True
        ids = [head.node_id, *(n.node_id for n in cluster.worker_nodes)]
        yield {"address": cluster.address, "node_ids": ids, "folder": folder}
    finally:
        if cluster is not None:
            cluster.shutdown()
        left = left_after(folder)
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(folder, ignore_errors=True)
        if left:
            raise RuntimeError(f"processes of the Ray cluster in {folder} outlived its "
                               f"shutdown: {left}")
