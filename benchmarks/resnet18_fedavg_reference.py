"""Plain-torch FedAvg of ResNet-18 on CIFAR-10, outside the app: is a round's lack of progress
the app's or the model's?

Ten clients a round, each with 100 images drawn at random from the whole training set (IID),
one local epoch of the client recipe (SGD, momentum 0.5, batch 10) at ``--lr``, every entry of
the state (BatchNorm's statistics and counters included) averaged with equal weights; the test
loss and accuracy of the global model on 1,000 random test images after every round. No Flower,
no valuation, no guards: what the app's ResNet-18 rounds should be compared with.

    python -m benchmarks.resnet18_fedavg_reference --lr 0.05 --out /tmp/ref-0.05.json

Measured 2026-11-28 on this project's 2-core CPU (docs/results/gpu-resnet18/README.md).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks._common import machine_info
from fedowen_task.data import load_dataset, resolve_data_dir, to_tensor
from fedowen_task.models import build_model
from fedowen_task.training import evaluate, train


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--samples", type=int, default=100, help="images per client")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, required=True, help="JSON of the rounds")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ds = load_dataset("cifar10", resolve_data_dir(args.data_dir))
    rng = np.random.default_rng(0)
    test = np.random.default_rng(9).choice(len(ds.y_test), 1000, replace=False)
    x_test, y_test = to_tensor(ds.x_test[test], ds.name), torch.as_tensor(ds.y_test[test])
    model = build_model("resnet18", 3, 10, seed=0)
    loss, acc = evaluate(model, x_test, y_test)
    rows = [{"round": 0, "test_loss": loss, "test_accuracy": acc}]
    print(f"round 0: test loss {loss:.4f}, accuracy {acc:.3f}", flush=True)
    for rnd in range(1, args.rounds + 1):
        states = []
        for c in range(args.clients):
            idx = rng.choice(len(ds.y_train), args.samples, replace=False)
            local = copy.deepcopy(model)
            train(local, to_tensor(ds.x_train[idx], ds.name), torch.as_tensor(ds.y_train[idx]),
                  epochs=1, lr=args.lr, momentum=0.5, batch_size=10, seed=rnd * 1000 + c)
            states.append(local.state_dict())
        model.load_state_dict({k: (sum(s[k].double() for s in states) / len(states)).to(
            states[0][k].dtype) for k in states[0]})
        loss, acc = evaluate(model, x_test, y_test)
        rows.append({"round": rnd, "test_loss": loss, "test_accuracy": acc})
        print(f"round {rnd}: test loss {loss:.4f}, accuracy {acc:.3f}", flush=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                    "machine": machine_info(), "rounds": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
