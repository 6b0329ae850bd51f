r"""Benchmark: 1000 virtual clients, 100 per round, through a real ``flwr run``: memory and time.

Runs ``--rounds`` FedOwen rounds (MNIST, LeNet, valuation ``--valuation`` at budget 4n = 400
coalition evaluations per round) on a SuperLink of our own with Ray,
``client-resources-num-cpus=1`` (2 actors on 2 cores), while a thread samples the memory of
the whole process tree under this script every 0.5 s: SuperLink, ``flwr run``, the simulation
(ServerApp + Ray driver), Ray's GCS/raylet and the ClientApp actors. It reports the peak sum of
RSS (double-counts shared pages) and of PSS (shared pages split among users: the real
footprint), the peak PSS per process name, seconds per round (``rounds.jsonl``) and the
valuation's seconds and share of each round. A failed run is a result too: its status and the
last lines of the run's and the SuperLink's logs go into the JSON. Example::

    PYTHONPATH=. python benchmarks/bench_scale.py \
        --out-json docs/benchmarks/scale.json.gz --out-md docs/benchmarks/scale.md
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    TreeMemorySampler,
    descendants,
    load_average,
    machine_info,
    markdown_table,
    write_outputs,
)
from benchmarks.bench_flower_overhead import flower_job
from fedowen_task.data import resolve_data_dir


def _children_of_self() -> list[int]:
    me = os.getpid()
    return sorted(descendants([me]) - {me})


def run_scale(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One sampled ``flwr run``; the row of results (or of the failure)."""
    start = time.perf_counter()
    with TreeMemorySampler(_children_of_self, interval=0.5) as sampler:
        try:
            res: dict[str, Any] = {"ok": True, **flower_job(args, work)}
        except RuntimeError as err:
            logs = sorted(work.glob("flwr-home-*/superlink/superlink.log"))
            tail = logs[-1].read_text().splitlines()[-40:] if logs else []
            res = {"ok": False, "error": str(err), "superlink_log_tail": tail}
    res.update(wall_s=time.perf_counter() - start,
               peak_rss_mib=sampler.peak("rss_mib"), peak_pss_mib=sampler.peak("pss_mib"),
               peak_pss_mib_by_name={k: v / 1024 for k, v in sorted(
                   sampler.peak_by_name.items(), key=lambda kv: -kv[1])},
               max_processes=max((s["processes"] for s in sampler.samples), default=0),
               memory_samples=sampler.samples)
    if res["ok"]:
        val = [v or 0.0 for v in res["valuation_s"]]
        res["valuation_share"] = [v / t for v, t in zip(val, res["per_round_s"], strict=True)]
    return res


def table(r: dict[str, Any], args: argparse.Namespace) -> str:
    """Markdown: the run's numbers, one per row."""
    rows: list[list[Any]] = [
        ["virtual clients / per round / rounds", f"{args.supernodes} / "
         f"{args.clients_per_round} / {args.rounds}"],
        ["status", "completed" if r["ok"] else f"FAILED: {r['error'].splitlines()[0]}"],
        ["peak RSS sum of the process tree", f"{r['peak_rss_mib'] / 1024:.2f} GiB"],
        ["peak PSS sum of the process tree", f"{r['peak_pss_mib'] / 1024:.2f} GiB"],
        ["processes in the tree (max)", r["max_processes"]],
    ]
    rows += [[f"peak PSS `{k}`", f"{v:.0f} MiB"]
             for k, v in list(r["peak_pss_mib_by_name"].items())[:6]]
    if r["ok"]:
        rows += [
            ["seconds per round (1, 2, ...)", ", ".join(f"{s:.1f}" for s in r["per_round_s"])],
            ["valuation seconds per round", ", ".join(f"{s:.1f}" for s in r["valuation_s"])],
            ["valuation share of the round", ", ".join(f"{s:.0%}" for s in r["valuation_share"])],
            ["coalition evaluations per round", ", ".join(str(s) for s in r["n_evals"])],
            ["fixed overhead (startup + teardown) s", f"{r['fixed_s']:.1f}"],
            ["wall s", f"{r['wall_s']:.1f}"],
        ]
    return markdown_table(["quantity", "value"], rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--supernodes", type=int, default=1000)
    p.add_argument("--clients-per-round", type=int, default=100)
    p.add_argument("--valuation", default="owen")
    p.add_argument("--client-max-samples", type=int, default=200)
    p.add_argument("--test-max-samples", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the ServerApp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    args = p.parse_args(argv)
    args.data_dir = resolve_data_dir(args.data_dir)
    machine = machine_info()
    print(machine, flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        res = run_scale(args, Path(tmp))
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    payload = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
               "result": res}
    write_outputs(payload, table(res, args), args.out_json, args.out_md)


if __name__ == "__main__":
    main()
