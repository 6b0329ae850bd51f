"""What the defence list costs around a Flower strategy (issue 72): FedAvg's ``aggregate_train``
alone against the same inside :class:`~fedowen_strategy.defences.defended.Defended`.

Ten hand-built replies (one boosted 5x, so a norm cap clips it) of a model of ``--entries``
float32 entries in four arrays, plus a BatchNorm layer's statistics and counter, against their
global model. Timed, in rotating order, each repeat (fresh replies each time, outside the
timing: a step writes a changed update back into its reply):

- ``fedavg``: Flower's FedAvg alone (the baseline);
- ``auto``: ``Defended(FedAvg, "auto")``, what the ServerApp runs around Flower's strategies
  (the statistics cap, off, and the statistics median): every reply decoded once, the
  aggregate decoded and re-encoded;
- ``full``: every screen and settle step the table holds that applies around FedAvg
  (``identity norm-ratio update-bound norm-cap statistics-cap links statistics-rule robust-lr``)
  with ``norm-cap = median`` and ``update-bound = clip``.

    PYTHONPATH=. python -m benchmarks.bench_defended --entries 2000000 --repeats 5 \\
        --out-json docs/benchmarks/defended.json --out-md docs/benchmarks/defended.md
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, Strategy

from benchmarks._common import (
    machine_info,
    markdown_table,
    rotated,
    summarise,
    timed,
    write_outputs,
)
from fedowen_strategy.defences.defended import Defended
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.replies import state_to_record
from sim.inline_grid import InProcessGrid, task_identity

CLIENTS = 10
FULL = ("identity norm-ratio update-bound norm-cap statistics-cap links statistics-rule "
        "robust-lr")


def global_model(entries: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Four float32 arrays of ``entries`` in all, and a BatchNorm layer's buffers."""
    sizes = [entries // 2, entries // 4, entries // 8, entries - entries // 2 - entries // 4
             - entries // 8]
    state = {f"layer{i}.weight": rng.normal(0, 0.1, n).astype(np.float32)
             for i, n in enumerate(sizes)}
    return {**state, "bn.running_mean": np.zeros(64, np.float32),
            "bn.running_var": np.ones(64, np.float32),
            "bn.num_batches_tracked": np.array(10, np.int64)}


def replies(glob: dict[str, np.ndarray], rng: np.random.Generator) -> list[Message]:
    """One reply per client: the global model plus a small step (client 0's x5)."""
    out = []
    for i in range(CLIENTS):
        scale = 5.0 if i == 0 else 1.0
        state = {k: (v + scale * rng.normal(0, 1e-3, v.shape).astype(v.dtype))
                 if v.dtype == np.float32 else v for k, v in glob.items()}
        request = Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=1000 + i)
        out.append(Message(RecordDict({
            "arrays": state_to_record(state),
            "metrics": MetricRecord({"num-examples": 10 + i}),
            "client": ConfigRecord({"client-id": str(i)})}), reply_to=request))
    return out


def idle(msg: Message, ctx: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)


def ways() -> dict[str, Callable[[], Strategy]]:
    guards = Guards(norm_cap="median", update_bound="clip")
    return {"fedavg": lambda: FedAvg(fraction_train=1.0),
            "auto": lambda: Defended(FedAvg(fraction_train=1.0), "auto"),
            "full": lambda: Defended(FedAvg(fraction_train=1.0), FULL, guards)}


def one_round(make: Callable[[], Strategy], glob: dict[str, np.ndarray],
              round_replies: list[Message]) -> float:
    """Seconds of one ``aggregate_train`` after a ``configure_train``."""
    strategy = make()
    grid = InProcessGrid(idle, [{"partition-id": i} for i in range(CLIENTS)])
    list(strategy.configure_train(1, state_to_record(glob), ConfigRecord(), grid))
    seconds, (arrays, _) = timed(lambda: strategy.aggregate_train(1, round_replies))
    assert arrays is not None
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out-json")
    parser.add_argument("--out-md")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    glob = global_model(args.entries, rng)
    made = ways()
    samples: dict[str, list[float]] = {name: [] for name in made}
    with task_identity():  # Flower's messages need a run id outside a ServerApp
        for r in range(args.repeats):
            for name in rotated(list(made), r):
                samples[name].append(one_round(made[name], glob, replies(glob, rng)))
    base = summarise(samples["fedavg"], "median")
    rows = [[name, f"{summarise(s, 'median'):.3f}", f"{summarise(s, 'min'):.3f}",
             f"{summarise(s, 'median') / base:.2f}"] for name, s in samples.items()]
    table = markdown_table(["way", "median s / round", "min s", "ratio to fedavg"], rows)
    payload: dict[str, Any] = {"machine": machine_info(), "entries": args.entries,
                               "clients": CLIENTS, "repeats": args.repeats, "samples": samples}
    write_outputs(payload, table, args.out_json, args.out_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
