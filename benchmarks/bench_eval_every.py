"""A whole cell with the central evaluation every round against ``eval-every = N``.

    PYTHONPATH=. python benchmarks/bench_eval_every.py --every 5 \\
        --out-json docs/benchmarks/eval_every.json --out-md docs/benchmarks/eval_every.md

Runs one cell of the inline backend (the ServerApp and ClientApp code a sweep runs; MNIST,
LeNet, IF 0.01, alpha 0.1, 100 clients, 10 a round, validation 5%) per arm (``fedowen``: the
app's defaults; ``fedavg-equal``: equal-weight FedAvg, random selection), once with
``eval-every = 1`` (the baseline) and once with ``--every``, in rotating order, each in its own
process, and prints each cell's wall time and the ratio. Then it checks what the option
promises: both runs recorded the same selections, phi and weights in every round, and the same
accuracies where both measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import load_average, machine_info, markdown_table, write_outputs

ARMS: dict[str, dict[str, Any]] = {
    "fedowen": {},
    "fedavg-equal": {"valuation": "none", "selection": "random", "aggregation": "uniform"},
}
BASE = {"dataset": "mnist", "model": "lenet", "imbalance-factor": 0.01, "alpha": 0.1,
        "partition-scheme": "per-class", "clients-per-round": 10, "validation-fraction": 0.05,
        "seed": 0}
TRAINING = ("selected", "returned", "phi", "weights")


def run_cell(config: dict[str, Any], out: Path) -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds of one inline cell in a fresh process, and its round records."""
    out.mkdir(parents=True)
    path = out / "cell.json"
    path.write_text(json.dumps({**config, "output-dir": str(out / "run")}))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sim.inline", "--run-config", str(path),
                           "--num-supernodes", "100"], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"the cell in {out} failed:\n{done.stderr[-3000:]}")
    rounds = [json.loads(line) for line in (out / "run" / "rounds.jsonl").open()]
    return seconds, rounds


def same_training(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Every round's training records equal, and the accuracies where both runs measured."""
    if [r["round"] for r in a] != [r["round"] for r in b]:
        return False
    for x, y in zip(a, b, strict=True):
        if any(x.get(k) != y.get(k) for k in TRAINING):
            return False
        if "test_accuracy" in y and (x["test_accuracy"], x.get("val_accuracy")) != \
                (y["test_accuracy"], y.get("val_accuracy")):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--out-json", default=None)
    parser.add_argument("--out-md", default=None)
    args = parser.parse_args()
    info = machine_info()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, arm in enumerate(args.arms):
            config = {**BASE, **ARMS[arm], "num-server-rounds": args.rounds,
                      **({"data-dir": args.data_dir} if args.data_dir else {})}
            order = (1, args.every) if k % 2 == 0 else (args.every, 1)
            timed = {}
            for every in order:
                timed[every] = run_cell({**config, "eval-every": every},
                                        Path(tmp) / f"{arm}-every{every}")
                print(f"{arm} eval-every {every}: {timed[every][0]:.1f} s "
                      f"(load {load_average()[0]:.1f})", flush=True)
            base, fast = timed[1], timed[args.every]
            measured = sum("test_accuracy" in r for r in fast[1])
            rows.append({"arm": arm, "rounds": args.rounds, "every": args.every,
                         "seconds_every_1": round(base[0], 1),
                         f"seconds_every_{args.every}": round(fast[0], 1),
                         "ratio": round(fast[0] / base[0], 3),
                         "evaluations": [len(base[1]), measured],
                         "same_training": same_training(base[1], fast[1])})
            print(json.dumps(rows[-1]), flush=True)
    info["load_avg_end"] = [round(x, 2) for x in load_average()]
    table = markdown_table(
        ["arm", "rounds", "eval-every 1 (s)", f"eval-every {args.every} (s)", "ratio",
         "evaluations", "same training"],
        [[r["arm"], r["rounds"], r["seconds_every_1"], r[f"seconds_every_{args.every}"],
          r["ratio"], " vs ".join(map(str, r["evaluations"])), r["same_training"]]
         for r in rows])
    write_outputs({"machine": info, "rows": rows}, table, args.out_json, args.out_md)


if __name__ == "__main__":
    main()
