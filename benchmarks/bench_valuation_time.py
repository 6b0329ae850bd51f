r"""Benchmark: seconds of one round's valuation by method and number of participants n.

What one call of :func:`fedowen_strategy.round.contribution.value_round` costs the server, with the
real batched torch utility (:class:`fedowen_strategy.torch_utility.batched.CoalitionGame`,
LeNet, the MNIST server evaluation set of 600 images = 1% of the 60k training images) at the
server's budget ``n x budget-m`` (``2^n`` for ``exact``), with the estimator parameters the
ServerApp passes (``RunConfig.estimator_params``). The time covers building the utility
(stacking the states, the chunk size), ``nu(empty)`` and ``nu(N)``, and the estimator.

Client states: a seeded LeNet is trained for one epoch on ``--global-samples`` MNIST images
(the round's global model); each of the n clients then trains a copy for one epoch on its own
``--client-samples`` images drawn from a single-class-heavy slice (non-IID), so coalitions
really differ in accuracy (truncating methods such as GTG behave as in a run).

Baseline, measured in the same run: one plain forward pass of the global LeNet over the 600
images (``forward``); ``valuation / forward`` says how many forward passes a round's
valuation costs (FedAvg itself values nothing). The utility's construction for a round
(the factory's call alone, ``build``) is timed separately. Jobs are repeated ``--repeats``
times in rotating order; the table shows the minimum seconds, and ``valuation / forward``
is the median over runs of each run's seconds over the mean of the forward passes timed just
before and after it (the load on a shared machine swings within seconds, so only adjacent
timings compare).
Example::

    PYTHONPATH=. python benchmarks/bench_valuation_time.py \
        --out-json docs/benchmarks/valuation_time.json --out-png docs/benchmarks/valuation_time.png
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks._common import (
    load_average,
    machine_info,
    markdown_table,
    rotated,
    summarise,
    timed,
    write_outputs,
)
from fedowen_strategy.round.contribution import ValuationSettings, value_round
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_task.data import load_dataset, resolve_data_dir, to_tensor
from fedowen_task.holdout import server_eval_split
from fedowen_task.models import build_model, load_numpy_state, state_to_numpy
from fedowen_task.training import train
from server_app.config import RunConfig

METHODS = ("owen", "owen-paper", "mc-shapley", "gtg-shapley", "banzhaf", "weighted-shap", "loo",
           "exact", "shapfed-wa")
EXACT_MAX_N = 10


def make_round(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Global model, n trained client states, their sizes and the eval set (seeded)."""
    ds = load_dataset("mnist", resolve_data_dir(args.data_dir))
    eval_idx, pool = server_eval_split(ds.y_train, 0.01, args.seed)
    x_eval = to_tensor(ds.x_train[eval_idx], ds.name)
    y_eval = torch.as_tensor(ds.y_train[eval_idx], dtype=torch.long)
    rng = np.random.default_rng([args.seed, n])
    model = build_model("lenet", 1, 10, seed=args.seed)
    gidx = rng.choice(pool, args.global_samples, replace=False)
    train(model, to_tensor(ds.x_train[gidx], ds.name), torch.as_tensor(ds.y_train[gidx]),
          epochs=1, lr=0.02, momentum=0.9, batch_size=10, seed=args.seed)
    global_state = state_to_numpy(model)
    by_class = [pool[ds.y_train[pool] == c] for c in range(10)]
    states, sizes = [], []
    for i in range(n):
        main = rng.choice(by_class[i % 10], args.client_samples // 2, replace=False)
        rest = rng.choice(pool, args.client_samples - len(main), replace=False)
        idx = np.concatenate([main, rest])
        client = build_model("lenet", 1, 10)
        load_numpy_state(client, global_state)
        train(client, to_tensor(ds.x_train[idx], ds.name), torch.as_tensor(ds.y_train[idx]),
              epochs=1, lr=0.02, momentum=0.9, batch_size=10, seed=args.seed + 1 + i)
        states.append(state_to_numpy(client))
        sizes.append(int(rng.integers(args.client_samples // 2, 2 * args.client_samples)))
    return {"model": model.eval(), "global": global_state, "states": states, "sizes": sizes,
            "x": x_eval, "y": y_eval}


def bench_n(n: int, repeats: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """All methods at one n, interleaved with the forward baseline; one row per method.

    ``exact`` (2^n evaluations, a minute at n=10) runs in the first repeat only."""
    r = make_round(n, args)
    # the game this benchmark's committed results measured (the library's defaults before
    # issue 30 made them the app's: accuracy, average game)
    factory = CoalitionUtility(r["model"], r["x"], r["y"], metric="accuracy",
                               device=torch.device("cpu"))
    methods = [m for m in args.methods if m != "exact" or n <= EXACT_MAX_N]

    def forward() -> None:
        with torch.inference_mode():
            for s in range(0, len(r["x"]), 256):
                r["model"](r["x"][s : s + 256])

    def valuation(method: str) -> Callable[[], Any]:
        params = RunConfig(valuation=method).estimator_params()
        settings = ValuationSettings(method=method, budget_m=args.budget_m, params=params,
                                     game="average")
        rng = np.random.default_rng(args.seed)
        return lambda: value_round(r["states"], r["sizes"], r["global"], settings, factory, rng)

    jobs: dict[str, Callable[[], Any]] = {m: valuation(m) for m in methods}
    jobs["build"] = lambda: factory(r["global"], r["states"], r["sizes"])
    forward()  # warm-up
    runs: dict[str, list[float]] = {k: [] for k in [*jobs, "forward"]}
    paired: dict[str, list[float]] = {k: [] for k in jobs}  # run / forward around it
    evals: dict[str, int] = {}
    for rep in range(repeats):
        for key in rotated(list(jobs), rep):
            if key == "exact" and rep > 0:
                continue
            fwd_before = min(timed(forward)[0] for _ in range(3))
            seconds, out = timed(jobs[key])
            fwd_after = min(timed(forward)[0] for _ in range(3))
            runs["forward"].append(fwd_before)
            runs[key].append(seconds)
            paired[key].append(seconds / ((fwd_before + fwd_after) / 2))
            if key != "build":
                evals[key] = out.n_evals
        print(f"n={n} repeat {rep + 1}/{repeats} done, load {load_average()[0]:.1f}",
              flush=True)
    fwd = summarise(runs["forward"], args.summary)
    build = summarise(runs["build"], args.summary)
    rows = []
    for m in methods:
        sec = summarise(runs[m], args.summary)
        budget = 2**n if m == "exact" else n * args.budget_m
        rows.append({"method": m, "n": n, "budget": 0 if m == "shapfed-wa" else budget,
                     "n_evals": evals[m], "seconds": sec, "forward_s": fwd,
                     "over_forward": statistics.median(paired[m]), "build_s": build,
                     "build_over_forward": statistics.median(paired["build"]),
                     "runs_s": runs[m], "over_forward_runs": paired[m]})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per (method, n)."""
    head = ["method", "n", "budget", "n_evals", "seconds", "forward s", "valuation / forward",
            "of which build s"]
    body = [[r["method"], r["n"], r["budget"], r["n_evals"], f"{r['seconds']:.3f}",
             f"{r['forward_s'] * 1e3:.1f} ms", f"{r['over_forward']:.1f}",
             "-" if r["method"] == "shapfed-wa" else f"{r['build_s']:.3f}"]
            for r in sorted(rows, key=lambda r: (METHODS.index(r["method"]), r["n"]))]
    return markdown_table(head, body)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Valuation seconds vs n per method, log-log, with the forward baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in METHODS:
        pts = sorted((r["n"], r["seconds"]) for r in rows if r["method"] == m)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=m)
    fwd = sorted({(r["n"], r["forward_s"]) for r in rows})
    ax.plot(*zip(*fwd, strict=True), "k--", label="1 forward pass (baseline)")
    ax.set(xscale="log", yscale="log", xlabel="participants per round n",
           ylabel="seconds per round", title="One round's valuation, LeNet/MNIST, budget 4n")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ns", type=int, nargs="+", default=[10, 50, 100])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--budget-m", type=int, default=4)
    p.add_argument("--global-samples", type=int, default=1000)
    p.add_argument("--client-samples", type=int, default=60)
    p.add_argument("--repeats", type=int, nargs="+", default=[3, 2, 1],
                   help="repeats per n (one value: for every n)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: robust on a loaded 2-core machine)")
    p.add_argument("--summary", choices=["min", "median"], default="min")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="default: $FEDOWEN_DATA or ~/.cache")
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    p.add_argument("--out-png", default=None)
    args = p.parse_args(argv)
    repeats = args.repeats * len(args.ns) if len(args.repeats) == 1 else args.repeats
    if len(repeats) != len(args.ns) or min(repeats) < 1:
        p.error(f"--repeats needs one value >= 1 or one per n ({len(args.ns)}), got {args.repeats}")
    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(machine, flush=True)
    rows = [row for n, k in zip(args.ns, repeats, strict=True) for row in bench_n(n, k, args)]
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    write_outputs({"machine": machine, "args": vars(args), "rows": rows}, table(rows),
                  args.out_json, args.out_md)
    if args.out_png:
        plot(rows, args.out_png)


if __name__ == "__main__":
    main()
