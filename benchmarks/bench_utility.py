"""Benchmark: batched coalition utility vs the naive one vs plain forward passes, same run.

For each model, values ``--coalitions`` distinct random non-empty coalitions of ``--clients``
clients four ways and reports wall-clock and process CPU seconds:

* ``batched``: ``CoalitionGame`` construction (preparing the network, stacking the states, the
  chunk size) plus one call, with the utility's defaults (on the CPU: the exactly rewritten
  forward of :mod:`fedowen_strategy.torch_utility.forward`, batches of 128);
* ``eager``: the same with ``forward="eager"`` and ``--batch-size`` (the previous CPU path);
* ``naive``: ``naive_utility`` (average state dicts, load, forward, per coalition);
* ``forwards``: ``--coalitions`` plain forward passes of one model over the evaluation set
  (batches of ``--batch-size``).

Each is timed ``--repeats`` times in rotating order and the minimum is reported (background
load only ever adds time); every run is kept in the JSON. With one torch thread the CPU-time
ratios are the steadier figure on a shared machine.

The target is batched <= 0.8 x forwards (issue 13). Inputs are random tensors of the real
shapes (MNIST 1x28x28, CIFAR-10 3x32x32) and client weights are the seeded initialisation
plus relative noise: timing does not depend on the values. Example::

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
from tests.utility_reference import naive_utility

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
        u = CoalitionGame(*common, metric=args.metric, device=device)
        return u(masks), u

    def eager() -> tuple[np.ndarray, CoalitionGame]:
        u = CoalitionGame(*common, metric=args.metric, device=device, forward="eager",
                          batch_size=args.batch_size)
        return u(masks), u

    forwards()  # warm-up (kernels, allocator), not timed
    jobs: dict[str, Callable[[], Any]] = {
        "forwards": forwards,
        "naive": lambda: naive_utility(*common, masks, args.metric, args.batch_size, device),
        "batched": batched,
        "eager": eager,
    }
    runs: dict[str, list[float]] = {key: [] for key in jobs}
    cpu: dict[str, list[float]] = {key: [] for key in jobs}
    outs: dict[str, Any] = {}
    for r in range(args.repeats):  # rotate the order so background load hits all alike
        for key in list(jobs)[r % 4 :] + list(jobs)[: r % 4]:
            seconds, cpu_seconds, outs[key] = _timed(jobs[key], device)
            runs[key].append(seconds)
            cpu[key].append(cpu_seconds)
            print(f"{name} run {r + 1}/{args.repeats} {key}: {seconds:.2f} s wall, "
                  f"{cpu_seconds:.2f} s CPU", flush=True)
    wall = {key: min(v) for key, v in runs.items()}
    cpu_min = {key: min(v) for key, v in cpu.items()}
    v_naive, (v_batched, utility), (v_eager, _) = outs["naive"], outs["batched"], outs["eager"]
    return {
        "model": name, "clients": args.clients, "eval_images": n_eval,
        "coalitions": args.coalitions, "mode": utility.mode,
        "forward": "rewrite" if isinstance(utility._net, torch.fx.GraphModule) else "eager",
        "batch": utility.batch_size, "chunk": utility.chunk_size,
        **{f"{key}_s": v for key, v in wall.items()},
        **{f"{key}_over_forwards": wall[key] / wall["forwards"] for key in wall},
        **{f"cpu_{key}_over_forwards": cpu_min[key] / cpu_min["forwards"] for key in wall},
        "batched_over_naive": wall["batched"] / wall["naive"],
        "max_abs_diff": float(np.max(np.abs(v_batched - v_naive))),
        "max_abs_diff_eager": float(np.max(np.abs(v_eager - v_naive))),
        "runs_s": runs, "cpu_runs_s": cpu,
    }  # fmt: skip


def _markdown(rows: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    k = rows[0]["coalitions"]
    head = (
        "| model | n | eval | k | mode, forward, batch, chunk | batched s | eager s | naive s "
        f"| {k} forwards s | batched/forwards | eager/forwards | naive/forwards "
        "| CPU time: batched/forwards, eager/forwards | max diff (batched, eager) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['model']} | {r['clients']} | {r['eval_images']} | {r['coalitions']} "
        f"| {r['mode']}, {r['forward']}, {r['batch']}, {r['chunk']} | {r['batched_s']:.2f} "
        f"| {r['eager_s']:.2f} | {r['naive_s']:.2f} | {r['forwards_s']:.2f} "
        f"| {r['batched_over_forwards']:.2f} | {r['eager_over_forwards']:.2f} "
        f"| {r['naive_over_forwards']:.2f} "
        f"| {r['cpu_batched_over_forwards']:.2f}, {r['cpu_eager_over_forwards']:.2f} "
        f"| {r['max_abs_diff']:.1e}, {r['max_abs_diff_eager']:.1e} |\n"
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
    parser.add_argument("--batch-size", type=int, default=256,
                        help="batch of the plain forwards, naive and eager (batched: default)")
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
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
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
