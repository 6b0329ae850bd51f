r"""Benchmark: the valuation's share of a real round, before and after, in one run (issue 71).

For one setting, each valuation of ``--valuations`` (the first is "before", the app's
incumbent) plays ``--rounds`` real rounds through each way of ``--ways``:

* ``inline``: the inline backend (:func:`sim.inline.inline_run`: the real ServerApp and
  ClientApp over the in-process grid, one child process, as the experiment runner starts it);
* ``flwr``: a real ``flwr run`` on a SuperLink of its own (Ray, one CPU a virtual client).

Every number is read from the run's own ``rounds.jsonl``: ``round_seconds`` (selection, client
training and aggregation, the valuation included, the central evaluation not) and
``valuation_seconds``; the share is their ratio, median over rounds 2..K (round 1 also
prepares the network and the data), with round 1 beside it. Runs alternate between the
valuations within each way (the order rotated per repeat) so drifting load hits both sides;
the load averages before and after every run are kept. Settings::

    lenet100  MNIST, LeNet, 100 clients a round of 1,000 (IF 0.01, alpha 0.1)
    resnet18  CIFAR-10, ResNet-18, 10 a round of 100, 100 images a client, 1,000 test images

    PYTHONPATH=. FEDOWEN_DATA=/work/shared/data python benchmarks/bench_valuation_share.py \
        --setting lenet100 --valuations owen-antithetic first-order-simpson --rounds 4 \
        --out-json docs/benchmarks/valuation_share_lenet100.json \
        --out-md docs/benchmarks/valuation_share_lenet100.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import load_average, machine_info, markdown_table, rotated, write_outputs
from fedowen_deploy.launcher import LocalSuperLink, flwr_run
from fedowen_task.data import resolve_data_dir
from server_app.store.records import read_rounds
from sim.cell_state import cpu_kernels
from sim.inline import inline_run

SETTINGS: dict[str, dict[str, Any]] = {
    "lenet100": {"dataset": "mnist", "model": "lenet", "clients-per-round": 100,
                 "nodes": 1000},
    "resnet18": {"dataset": "cifar10", "model": "resnet18", "clients-per-round": 10,
                 "nodes": 100, "client-max-samples": 100, "test-max-samples": 1000},
}
WAYS = ("inline", "flwr")


def run_config(setting: str, valuation: str, rounds: int, seed: int, data_dir: str,
               out: Path) -> tuple[dict[str, Any], int]:
    """The run config of one run and its number of supernodes."""
    cfg = dict(SETTINGS[setting])
    nodes = int(cfg.pop("nodes"))
    cfg.update({"valuation": valuation, "num-server-rounds": rounds, "seed": seed,
                "data-dir": data_dir, "output-dir": str(out)})
    return cfg, nodes


def play(way: str, cfg: dict[str, Any], nodes: int, work: Path, timeout: float) -> None:
    """One real run; raises with the run's tail when it did not complete."""
    if way == "inline":
        outcome = inline_run(None, cfg, num_supernodes=nodes, timeout=timeout)
    else:
        with LocalSuperLink(work / f"flwr-home-{time.time_ns()}") as link:
            outcome = flwr_run(link, cfg, num_supernodes=nodes, cpus_per_client=1.0,
                               timeout=timeout)
    if not outcome.ok:
        tail = "\n".join(outcome.output.splitlines()[-30:])
        raise RuntimeError(f"{way} run of {cfg['valuation']} ended {outcome.status}:\n{tail}")


def rounds_of(out: Path) -> list[dict[str, float]]:
    """round_seconds, valuation_seconds and n_evals of every trained round of ``out`` (round 0
    records the initial model only)."""
    rows = [r for r in read_rounds(out) if int(r.get("round", 0)) >= 1]
    if not rows or any(r.get("valuation_seconds") is None for r in rows):
        raise RuntimeError(f"{out}/rounds.jsonl lacks round or valuation seconds")
    return [{"round": int(r["round"]), "round_s": float(r["round_seconds"]),
             "valuation_s": float(r["valuation_seconds"]), "n_evals": int(r["n_evals"])}
            for r in rows]


def summary(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Round 1's share and the medians over rounds 2..K."""
    later = rounds[1:] or rounds
    return {"share_round1": rounds[0]["valuation_s"] / rounds[0]["round_s"],
            "share": statistics.median(r["valuation_s"] / r["round_s"] for r in later),
            "round_s": statistics.median(r["round_s"] for r in later),
            "valuation_s": statistics.median(r["valuation_s"] for r in later),
            "n_evals": statistics.median(r["n_evals"] for r in later)}


def table(rows: list[dict[str, Any]], before: str) -> str:
    base = {(r["way"], r["valuation"]): r for r in rows if r["valuation"] == before}
    head = ["way", "valuation", "runs", "share of a round (rounds 2..K)", "round 1",
            "valuation s", "round s", "valuation / before's", "round / before's", "n_evals"]
    body = []
    for r in rows:
        b = base[(r["way"], before)]
        body.append([r["way"], r["valuation"], r["runs"], f"{100 * r['share']:.0f}%",
                     f"{100 * r['share_round1']:.0f}%", f"{r['valuation_s']:.2f}",
                     f"{r['round_s']:.2f}", f"{r['valuation_s'] / b['valuation_s']:.3f}",
                     f"{r['round_s'] / b['round_s']:.3f}", f"{r['n_evals']:.0f}"])
    return markdown_table(head, body)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setting", choices=list(SETTINGS), default="lenet100")
    p.add_argument("--valuations", nargs="+", default=["owen-antithetic", "first-order-simpson"],
                   help="the first is 'before' (the ratios' denominator)")
    p.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1, help="runs per (way, valuation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--data-dir", default=None, help="default: $FEDOWEN_DATA or ../shared/data")
    p.add_argument("--out-json", default=None)
    p.add_argument("--out-md", default=None)
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error(f"--rounds {args.rounds}: needs >= 2 (round 1 is reported apart)")
    data_dir = str(resolve_data_dir(args.data_dir))
    machine = {**machine_info(), "kernels": cpu_kernels()}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-share-") as tmp:
        for way in args.ways:
            for repeat in range(args.repeats):
                for valuation in rotated(args.valuations, repeat):
                    out = Path(tmp) / f"{way}-{valuation}-{repeat}"
                    cfg, nodes = run_config(args.setting, valuation, args.rounds, args.seed,
                                            data_dir, out)
                    load_before = load_average()[0]
                    play(way, cfg, nodes, Path(tmp), args.timeout)
                    runs.append({"way": way, "valuation": valuation, "repeat": repeat,
                                 "load_before": load_before, "load_after": load_average()[0],
                                 "rounds": rounds_of(out)})
                    print(f"{way} {valuation} #{repeat}: {summary(runs[-1]['rounds'])}",
                          flush=True)
    machine["load_avg_end"] = [round(x, 2) for x in load_average()]
    rows = []
    for way in args.ways:
        for valuation in args.valuations:
            mine = [r for r in runs if (r["way"], r["valuation"]) == (way, valuation)]
            pooled = [summary(r["rounds"]) for r in mine]
            rows.append({"way": way, "valuation": valuation, "runs": len(mine),
                         **{k: statistics.median(s[k] for s in pooled) for k in pooled[0]}})
    payload = {"machine": machine, "setting": {args.setting: SETTINGS[args.setting]},
               "args": vars(args), "rows": rows, "runs": runs}
    write_outputs(payload, table(rows, args.valuations[0]), args.out_json, args.out_md)


if __name__ == "__main__":
    main()
