"""Benchmark: batched coalition utility vs the naive one vs plain forward passes, same run.

For each model, values ``--coalitions`` distinct random non-empty coalitions of ``--clients``
clients three ways and reports wall-clock seconds:

* ``batched``: ``CoalitionGame`` construction (stacking, stem cache) plus one call;
* ``naive``: ``naive_utility`` (average state dicts, load, forward, per coalition);
* ``forwards``: ``--coalitions`` plain forward passes of one model over the evaluation set.

Each is timed ``--repeats`` times in rotating order and the minimum is reported (background
load only ever adds time); every run is kept in the JSON.

The target is batched <= forwards. Inputs are random tensors of the real shapes (MNIST
1x28x28, CIFAR-10 3x32x32) and client weights are the seeded initialisation plus relative
noise: timing does not depend on the values. Example::

    PYTHONPATH=. python benchmarks/bench_utility.py --out-json bench.json --out-md bench.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedowen_strategy.torch_utility.batched import CoalitionGame, resolve_device
from fedowen_task.models import build_model, state_to_numpy
from server_app.utility_reference import naive_utility

SETUPS = {"lenet": ((1, 28, 28), "lenet-eval"), "resnet18": ((3, 32, 32), "resnet-eval")}


def _clients(model: torch.nn.Module, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    base = state_to_numpy(model)
    out = []
    for _ in range(n):
        state = {}
        for key, v in base.items():
            if np.issubdtype(v.dtype, np.floating):
                sd = 0.1 * max(float(v.std()), 0.1)
                v = (v + rng.normal(0.0, sd, v.shape)).astype(v.dtype)
                if key.endswith("running_var"):
                    v = np.abs(v) + 0.1
            state[key] = v
        out.append(state)
    return out


def _distinct_masks(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    seen: dict[bytes, np.ndarray] = {}
    while len(seen) < k:
        row = rng.random(n) < 0.5
        if row.any():
            seen.setdefault(row.tobytes(), row)
    return np.array(list(seen.values()))


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, float, Any]:
    """Wall seconds, process CPU seconds (all threads) and the result of ``fn()``."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu, out


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Time batched, naive and plain forwards for one model; return one result row."""
    shape, eval_key = SETUPS[name]
    n_eval = getattr(args, eval_key.replace("-", "_"))
    rng = np.random.default_rng(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = build_model(name, shape[0], 10, seed=args.seed)
    glob = state_to_numpy(model)
    clients = _clients(model, args.clients, rng)
    num_examples = rng.integers(100, 1000, args.clients).tolist()
    x, y = (
        torch.randn(n_eval, *shape, generator=gen),
        torch.randint(0, 10, (n_eval,), generator=gen),
    )
    masks = _distinct_masks(args.clients, args.coalitions, rng)
    common = (model, glob, clients, num_examples, x, y)

    net, xd = model.to(device).eval(), x.to(device)

    def forwards() -> None:
        with torch.inference_mode():
            for _ in range(args.coalitions):
                for s in range(0, n_eval, args.batch_size):
                    net(xd[s : s + args.batch_size])

    def batched() -> tuple[np.ndarray, CoalitionGame]:
        u = CoalitionGame(*common, metric=args.metric, device=device,
                             batch_size=args.batch_size)  # fmt: skip
        return u(masks), u

    forwards()  # warm-up (kernels, allocator), not timed
    runs: dict[str, list[float]] = {"forwards": [], "naive": [], "batched": []}
    cpu: dict[str, list[float]] = {key: [] for key in runs}
    jobs: dict[str, Callable[[], Any]] = {
        "forwards": forwards,
        "naive": lambda: naive_utility(*common, masks, args.metric, args.batch_size, device),
        "batched": batched,
    }
    for r in range(args.repeats):  # rotate the order so background load hits all three alike
        for key in list(jobs)[r % 3 :] + list(jobs)[: r % 3]:
            seconds, cpu_seconds, out = _timed(jobs[key], device)
            runs[key].append(seconds)
            cpu[key].append(cpu_seconds)
            print(f"{name} run {r + 1}/{args.repeats} {key}: {seconds:.2f} s wall", flush=True)
            if key == "naive":
                v_naive = out
            elif key == "batched":
                (v_batched, utility) = out
    t_fwd, t_naive, t_batched = (min(runs[k]) for k in ("forwards", "naive", "batched"))
    c_fwd, c_naive, c_batched = (min(cpu[k]) for k in ("forwards", "naive", "batched"))
    return {
        "model": name, "clients": args.clients, "eval_images": n_eval,
        "coalitions": args.coalitions, "mode": utility.mode,
        "stem_cache_mib": utility.stem_cache_bytes / 2**20,
        "batched_s": t_batched, "naive_s": t_naive, "forwards_s": t_fwd,
        "batched_over_naive": t_batched / t_naive, "batched_over_forwards": t_batched / t_fwd,
        "max_abs_diff": float(np.max(np.abs(v_batched - v_naive))), "runs_s": runs,
        "cpu_batched_over_naive": c_batched / c_naive,
        "cpu_batched_over_forwards": c_batched / c_fwd,
        "cpu_runs_s": cpu,
    }  # fmt: skip


def _markdown(rows: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    head = (
        "| model | n | eval | k | mode | stem cache MiB | batched s | naive s | "
        f"{rows[0]['coalitions']} forwards s | batched/naive | batched/forwards "
        "| CPU-time ratios (b/n, b/f) | max diff |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['model']} | {r['clients']} | {r['eval_images']} | {r['coalitions']} | {r['mode']} "
        f"| {r['stem_cache_mib']:.0f} | {r['batched_s']:.2f} | {r['naive_s']:.2f} "
        f"| {r['forwards_s']:.2f} | {r['batched_over_naive']:.2f} "
        f"| {r['batched_over_forwards']:.2f} "
        f"| {r['cpu_batched_over_naive']:.2f}, {r['cpu_batched_over_forwards']:.2f} "
        f"| {r['max_abs_diff']:.1e} |\n"
        for r in rows
    )
    info = ", ".join(f"{k}: {v}" for k, v in machine.items())
    runs = len(rows[0]["runs_s"]["naive"])
    return (
        head + body + f"\nWall seconds, min over {runs} runs (CPU-time ratios likewise). {info}\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--coalitions", type=int, default=40)
    parser.add_argument("--lenet-eval", type=int, default=600, help="MNIST's 1%% = 600 images")
    parser.add_argument("--resnet-eval", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--metric", default="accuracy", choices=["accuracy", "neg-loss"])
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="report the min over repeats")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out-json", default=None)
    parser.add_argument("--out-md", default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.coalitions < 1 or args.clients < 1:
        parser.error("--repeats, --coalitions and --clients must be >= 1")
    if args.coalitions > 2**args.clients - 1:
        parser.error(f"only {2**args.clients - 1} distinct non-empty coalitions exist")
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    machine = {
        "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "command": shlex.join([sys.executable, *sys.argv]),
    }  # fmt: skip
    print(", ".join(f"{k}: {v}" for k, v in machine.items()), flush=True)
    rows = []
    for name in args.models:
        rows.append(bench_model(name, args, device))
        print(json.dumps(rows[-1]), flush=True)
    table = _markdown(rows, machine)
    print(table)
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=2)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
