"""Record the full coalition game of one real FedAvg round (MNIST, LeNet, non-IID clients).

The game: n clients start one FedAvg round from a common global model (itself the result of
``--warmup-rounds`` FedAvg rounds among the same clients), each trains one local epoch on its
1-2 classes, and the utility of a coalition S is the accuracy, on a held-out set of
``--eval-size`` MNIST test images, of the example-count-weighted average of the weights of S
(the empty coalition is the starting global model). All 2^n utilities are written to a JSON
file that ``fedowen_strategy.valuation.games.TableGame.from_json`` reads.

Self-contained on purpose (torch + torchvision only) so the fixture can be re-made exactly:

    python benchmarks/record_fl_game.py --data-dir /work/shared/data \
        --out tests/data/fl_game_mnist_lenet_n10.json

Runs in about a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.datasets import MNIST

log = logging.getLogger("record_fl_game")


class LeNet(nn.Module):
    """LeNet-5 for 28x28 grey images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc3(F.relu(self.fc2(x)))


def load(data_dir: str, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ds = MNIST(root=data_dir, train=train, download=False)
    x = ds.data.unsqueeze(1).float().div(255.0).sub(0.1307).div(0.3081)
    return x, ds.targets.long()


def partition(
    y: np.ndarray, n_clients: int, rng: np.random.Generator, per_class: int
) -> tuple[list[np.ndarray], list[list[int]]]:
    """Each client gets 1 or 2 classes and ``per_class`` random examples of each."""
    parts, classes = [], []
    for i in range(n_clients):
        k = int(rng.integers(1, 3))
        cls = sorted({i % 10, int(rng.integers(0, 10))})[:k]
        idx = np.concatenate(
            [rng.choice(np.flatnonzero(y == c), per_class, replace=False) for c in cls]
        )
        parts.append(idx)
        classes.append(cls)
    return parts, classes


def local_train(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, gen: torch.Generator
) -> list[torch.Tensor]:
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for b in range(0, len(x), 32):
            sel = perm[b : b + 32]
            opt.zero_grad()
            F.cross_entropy(model(x[sel]), y[sel]).backward()
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


def average(states: list[list[torch.Tensor]], weights: np.ndarray) -> list[torch.Tensor]:
    w = torch.tensor(weights / weights.sum(), dtype=torch.float32)
    return [sum(wi * s[k] for wi, s in zip(w, states, strict=True)) for k in range(len(states[0]))]


@torch.no_grad()
def accuracy(
    model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> float:
    for p, v in zip(model.parameters(), params, strict=True):
        p.copy_(v)
    model.eval()
    return float((model(x).argmax(1) == y).float().mean())


def fedavg_round(
    model: nn.Module, start: list[torch.Tensor], data: list[tuple[torch.Tensor, torch.Tensor]],
    args: argparse.Namespace, gen: torch.Generator,
) -> list[list[torch.Tensor]]:
    states = []
    for x, y in data:
        for p, v in zip(model.parameters(), start, strict=True):
            p.data.copy_(v)
        states.append(local_train(model, x, y, args.local_epochs, args.lr, gen))
    return states


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--out", default="tests/data/fl_game_mnist_lenet_n10.json")
    ap.add_argument("--n-clients", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=300)
    ap.add_argument("--warmup-rounds", type=int, default=2)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--eval-size", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(args.seed)  # model init only; data and batches use explicit generators
    torch.set_num_threads(2)
    rng = np.random.default_rng(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    x_tr, y_tr = load(args.data_dir, train=True)
    x_te, y_te = load(args.data_dir, train=False)
    eval_idx = torch.from_numpy(rng.choice(len(y_te), args.eval_size, replace=False))
    x_ev, y_ev = x_te[eval_idx], y_te[eval_idx]
    parts, classes = partition(y_tr.numpy(), args.n_clients, rng, args.per_class)
    data = [(x_tr[torch.from_numpy(p)], y_tr[torch.from_numpy(p)]) for p in parts]
    sizes = np.array([len(p) for p in parts], dtype=float)
    model = LeNet()
    glob = [p.detach().clone() for p in model.parameters()]
    for r in range(args.warmup_rounds):
        glob = average(fedavg_round(model, glob, data, args, gen), sizes)
        log.info("warm-up round %d: global accuracy %.3f", r + 1, accuracy(model, glob, x_ev, y_ev))
    states = fedavg_round(model, glob, data, args, gen)
    n = args.n_clients
    utilities = np.empty(1 << n)
    for code in range(1 << n):
        members = [i for i in range(n) if code >> i & 1]
        params = glob if not members else average([states[i] for i in members], sizes[members])
        utilities[code] = accuracy(model, params, x_ev, y_ev)
        if code % 128 == 0:
            log.info("coalition %d/%d (%.0f s)", code, 1 << n, time.time() - t0)
    out = {
        "description": "All 2^n coalition utilities (held-out accuracy) of one FedAvg round",
        "n_players": n,
        "index": "coalition code c has client i iff bit i of c is set",
        "client_classes": classes,
        "client_sizes": sizes.astype(int).tolist(),
        "args": vars(args),
        "command": "python benchmarks/record_fl_game.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        ),
        "utilities": [round(float(u), 6) for u in utilities],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    log.info("nu(empty)=%.3f nu(N)=%.3f; wrote %s (%.0f s)", utilities[0], utilities[-1],
             args.out, time.time() - t0)


if __name__ == "__main__":
    main()
