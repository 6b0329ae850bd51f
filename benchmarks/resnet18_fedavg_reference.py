"""Plain-torch FedAvg of ResNet-18 on CIFAR-10, outside the app: is a round's lack of progress
the app's or the model's?

Ten clients a round, each with 100 images, one local epoch of the client recipe (SGD, momentum
0.5, batch 10) at ``--lr``; no Flower, no valuation, no guards: what the app's ResNet-18 rounds
should be compared with. Two data settings:

- ``--split iid`` (default): each client's images drawn at random from the whole training set;
  every entry of the state averaged with equal weights; the global model's loss and accuracy
  on 1,000 random test images after every round.
- ``--split app``: the app's own split (:func:`fedowen_task.partition.federated_split`: 100
  clients, long-tailed with ``--imbalance-factor``, per-class Dirichlet ``--alpha``, validation
  5% of the pool, ``--seed``), 10 clients drawn uniformly a round, each capped at 100 images as
  ``client-max-samples = 100`` does; parameters and BatchNorm statistics averaged with the
  clients' example counts (FedAvg; ``--weights equal``: equal weights, the app's
  ``aggregation = "uniform"``), counters kept; the loss and accuracy on ``--eval-samples``
  validation images (where choices are made), and as many test images, after every round.

``--model`` takes any built-in (``resnet18-gn``: GroupNorm), ``--momentum`` and
``--batch-size`` the rest of the recipe. Each round's row holds ``seconds`` and
``cpu_seconds`` (wall and process time of the clients' training and the average, one torch
thread: on a shared machine the process time is the cost) and ``eval_seconds``; round 1's
``train_loss`` is one local epoch's mean loss from the initial model on each of the round's
clients.

    python -m benchmarks.resnet18_fedavg_reference --lr 0.05 --out /tmp/ref-0.05.json
    python -m benchmarks.resnet18_fedavg_reference --split app --lr 0.01 --rounds 12 \\
        --out /tmp/ref-app-0.01.json
    python -m benchmarks.resnet18_fedavg_reference --split app --model resnet18-gn \\
        --weights equal --lr 0.03 --rounds 2 --eval-samples 500 --out /tmp/gn-0.03.json

Measured 2026-11-28 on this project's 2-core CPU (docs/results/gpu-resnet18/README.md), and
the per-model probe of issue 70 (docs/results/backbone-probe/README.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks._common import machine_info
from fedowen_task.data import DatasetArrays, load_dataset, resolve_data_dir, to_tensor
from fedowen_task.models import build_model
from fedowen_task.partition import federated_split
from fedowen_task.training import evaluate, train

Batch = tuple[torch.Tensor, torch.Tensor]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--model", default="resnet18", help="a built-in network (resnet18-gn, ...)")
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--weights", choices=("examples", "equal"), default="examples",
                   help="--split app: FedAvg's example-count weights, or equal weights")
    p.add_argument("--eval-samples", type=int, default=1000,
                   help="validation and test images read after each round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=10, help="clients a round")
    p.add_argument("--samples", type=int, default=100, help="images per client (at most)")
    p.add_argument("--split", choices=("iid", "app"), default="iid")
    p.add_argument("--alpha", type=float, default=0.1, help="--split app: Dirichlet alpha")
    p.add_argument("--imbalance-factor", type=float, default=0.01, help="--split app")
    p.add_argument("--seed", type=int, default=0, help="--split app: the split's seed")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, required=True, help="JSON of the rounds")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ds = load_dataset("cifar10", resolve_data_dir(args.data_dir))
    run = _app_rounds if args.split == "app" else _iid_rounds
    rows = run(ds, args)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                    "machine": machine_info(), "rounds": rows}, indent=1))
    return 0


def _iid_rounds(ds: DatasetArrays, args: argparse.Namespace) -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    test = np.random.default_rng(9).choice(len(ds.y_test), args.eval_samples, replace=False)
    x_test, y_test = to_tensor(ds.x_test[test], ds.name), torch.as_tensor(ds.y_test[test])
    model = build_model(args.model, 3, 10, seed=0)
    rows = [_row(0, model, {"test": (x_test, y_test)})]
    for rnd in range(1, args.rounds + 1):
        states, start, cpu = [], time.perf_counter(), time.process_time()
        for c in range(args.clients):
            idx = rng.choice(len(ds.y_train), args.samples, replace=False)
            local = copy.deepcopy(model)
            train(local, to_tensor(ds.x_train[idx], ds.name), torch.as_tensor(ds.y_train[idx]),
                  seed=rnd * 1000 + c, **_recipe(args))
            states.append(local.state_dict())
        model.load_state_dict({k: (sum(s[k].double() for s in states) / len(states)).to(
            states[0][k].dtype) for k in states[0]})
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        rows.append({**_row(rnd, model, {"test": (x_test, y_test)}), "seconds": seconds,
                     "cpu_seconds": cpu})
    return rows


def _app_rounds(ds: DatasetArrays, args: argparse.Namespace) -> list[dict[str, float]]:
    split = federated_split(ds, num_clients=100, alpha=args.alpha,
                            imbalance_factor=args.imbalance_factor, seed=args.seed,
                            validation_fraction=0.05)
    rng = np.random.default_rng(args.seed + 1000)
    val = rng.choice(split.val_idx, min(args.eval_samples, len(split.val_idx)), replace=False)
    test = np.random.default_rng(9).choice(len(ds.y_test), args.eval_samples, replace=False)
    sets = {"val": (to_tensor(ds.x_train[val], ds.name), torch.as_tensor(ds.y_train[val])),
            "test": (to_tensor(ds.x_test[test], ds.name), torch.as_tensor(ds.y_test[test]))}
    model = build_model(args.model, 3, 10, seed=args.seed)
    rows = [_row(0, model, sets)]
    for rnd in range(1, args.rounds + 1):
        states, counts, losses = [], [], []
        start, cpu = time.perf_counter(), time.process_time()
        for c in rng.choice(split.num_clients, args.clients, replace=False):
            idx = split.client_idx[c]
            if len(idx) > args.samples:
                idx = np.sort(rng.choice(idx, args.samples, replace=False))
            local = copy.deepcopy(model)
            fit = train(local, to_tensor(ds.x_train[idx], ds.name),
                        torch.as_tensor(ds.y_train[idx]), seed=rnd * 1000 + int(c),
                        **_recipe(args))
            states.append(local.state_dict())
            counts.append(len(idx))
            losses.append(fit["loss"])
        w = np.asarray(counts if args.weights == "examples" else [1] * len(counts), np.float64)
        w /= w.sum()
        model.load_state_dict({k: v if k.endswith("num_batches_tracked") else sum(
            float(wi) * s[k].double() for wi, s in zip(w, states, strict=True)).to(v.dtype)
            for k, v in states[0].items()})
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        rows.append({**_row(rnd, model, sets), "train_loss": float(np.mean(losses)),
                     "client_losses": losses, "examples": counts, "seconds": seconds,
                     "cpu_seconds": cpu})
    return rows


def _recipe(args: argparse.Namespace) -> dict[str, float]:
    """One local epoch of the recipe the flags give."""
    return {"epochs": 1, "lr": args.lr, "momentum": args.momentum,
            "batch_size": args.batch_size}


def _row(rnd: int, model: torch.nn.Module, sets: dict[str, Batch]) -> dict[str, float]:
    row: dict[str, float] = {"round": rnd}
    start = time.perf_counter()
    for name, (x, y) in sets.items():
        row[f"{name}_loss"], row[f"{name}_accuracy"] = evaluate(model, x, y)
    row["eval_seconds"] = time.perf_counter() - start
    print(f"round {rnd}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "round"),
          flush=True)
    return row


if __name__ == "__main__":
    raise SystemExit(main())
