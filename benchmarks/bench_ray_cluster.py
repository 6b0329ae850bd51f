"""Scaling of a sweep over Ray nodes: one preset, 1 node vs N nodes of one local cluster.

The same 16-cell MNIST sweep (2 methods x 8 seeds, 5 rounds by default) is dispatched with
``python -m sim.experiments run PRESET --ray-address ADDR`` to a cluster of 1 node, then of
``--nodes`` nodes (``sim.local_cluster``: every node its own raylet with ``--cpus-per-node``
CPUs; a cell asks for 1 CPU), each time into a fresh results folder. Reported: the wall time of
each sweep, the ratio to 1 node, the cells per node, and whether both sweeps wrote the same
per-round records (they must: placement changes nothing). Repeats alternate the order.

    PYTHONPATH=. python benchmarks/bench_ray_cluster.py \\
        --out-json docs/benchmarks/ray_cluster.json --out-md docs/benchmarks/ray_cluster.md

On one machine this measures how the runner keeps N nodes busy, not a real cluster's speed-up:
the nodes share the machine's cores (and whatever else runs on it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import load_average, machine_info, markdown_table, write_outputs
from fedowen_deploy.launcher import APP_DIR
from server_app.store.records import read_rounds
from sim.local_cluster import local_cluster

TIMING = ("valuation_seconds", "round_seconds", "elapsed_seconds")


def write_preset(args: argparse.Namespace, path: Path) -> Path:
    import tomli_w

    base: dict[str, Any] = {"dataset": "mnist", "num-server-rounds": args.rounds,
                            "clients-per-round": args.clients_per_round,
                            "client-max-samples": args.client_max_samples,
                            "test-max-samples": args.test_max_samples}
    path.write_text(tomli_w.dumps({
        "preset": {"name": "bench-ray-cluster", "num-supernodes": args.supernodes,
                   "cell-timeout": args.timeout, "backend": "inline"},
        "base": base,
        "grid": [{"name": "scale", "axes": {"seed": list(range(args.cells // 2)),
                                           "valuation": ["owen", "none"]}}]}))
    return path


def sweep(args: argparse.Namespace, preset: Path, nodes: int, results: Path) -> dict[str, Any]:
    """Run the preset on a fresh cluster of ``nodes`` nodes; wall time and placement."""
    with local_cluster(nodes=nodes, cpus_per_node=args.cpus_per_node) as cluster:
        env = {**os.environ, "PYTHONPATH": str(APP_DIR)}
        cmd = [sys.executable, "-m", "sim.experiments", "run", str(preset), "--results",
               str(results), "--ray-address", cluster["address"], "--data-dir",
               str(args.data_dir)]
        started = time.monotonic()
        done = subprocess.run(cmd, env=env, cwd=APP_DIR, capture_output=True, text=True,
                              timeout=args.timeout * args.cells, check=False)
        wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"sweep on {nodes} nodes failed:\n{done.stdout[-3000:]}"
                         f"\n{done.stderr[-3000:]}")
    placed: dict[str, int] = {}
    for line in done.stdout.replace("\r", "\n").splitlines():
        if "] done on node " in line:
            node = line.rsplit("(", 1)[1].split(")")[0]
            placed[node] = placed.get(node, 0) + 1
    return {"nodes": nodes, "wall_s": round(wall, 1), "cells_per_node": sorted(placed.values()),
            "load_end": round(load_average()[0], 2)}


def records(results: Path) -> dict[str, list[dict[str, Any]]]:
    return {d.name: [{k: v for k, v in r.items() if k not in TIMING} for r in read_rounds(d)]
            for d in sorted(results.iterdir()) if (d / "summary.json").is_file()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=int, default=16, help="cells (even: 2 methods x seeds)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--supernodes", type=int, default=100)
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument("--client-max-samples", type=int, default=0)
    p.add_argument("--test-max-samples", type=int, default=0)
    p.add_argument("--nodes", type=int, default=2, help="the larger cluster's nodes")
    p.add_argument("--cpus-per-node", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900, help="seconds per cell")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    args = p.parse_args(argv)
    from fedowen_task.data import resolve_data_dir

    args.data_dir = resolve_data_dir(args.data_dir)
    machine = machine_info()
    print(machine, flush=True)
    runs: list[dict[str, Any]] = []
    same = True
    with tempfile.TemporaryDirectory(prefix="bench-ray-cluster-") as tmp:
        preset = write_preset(args, Path(tmp) / "preset.toml")
        for r in range(args.repeats):
            order = [1, args.nodes] if r % 2 == 0 else [args.nodes, 1]
            seen = {}
            for nodes in order:
                results = Path(tmp) / f"r{r}-n{nodes}"
                runs.append({"repeat": r, **sweep(args, preset, nodes, results)})
                seen[nodes] = records(results)
                print(runs[-1], flush=True)
            same = same and seen[1] == seen[args.nodes] and len(seen[1]) == args.cells
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    best = {n: min(x["wall_s"] for x in runs if x["nodes"] == n) for n in (1, args.nodes)}
    rows = [[n, f"{best[n]:.0f}", f"{best[n] / best[1]:.2f}",
             next(x["cells_per_node"] for x in runs if x["nodes"] == n)] for n in best]
    table = markdown_table(["nodes", "wall s (min of repeats)", "ratio to 1 node",
                            "cells per node"], rows)
    table += f"\nSame per-round records on 1 and {args.nodes} nodes: {same}.\n"
    payload = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
               "runs": runs, "same_records": same}
    write_outputs(payload, table, args.out_json, args.out_md)
    if not same:
        raise SystemExit("the sweeps on 1 and N nodes wrote different records")


if __name__ == "__main__":
    main()
