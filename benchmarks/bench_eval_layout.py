"""Central test evaluation: channels-last (what ``fedowen_task.training.evaluate`` does on the
CPU) against the plain NCHW loop, in one process, on the MNIST test split with a trained LeNet.

    PYTHONPATH=. python benchmarks/bench_eval_layout.py --repeats 5

Prints the best time of each and their ratio, and checks that both give the same accuracy.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

from fedowen_task.data import load_dataset, to_tensor
from fedowen_task.models import build_model
from fedowen_task.training import evaluate, train


@torch.no_grad()
def evaluate_nchw(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                  batch_size: int = 1024) -> tuple[float, float]:
    """The evaluation loop without the layout change (the baseline)."""
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        logits = model(x[start:start + batch_size])
        yb = y[start:start + batch_size]
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(dim=1) == yb).sum())
    return loss_sum / len(x), correct / len(x)


def best_of(repeats: int, fn: Callable[[], tuple[float, float]]
            ) -> tuple[float, tuple[float, float]]:
    """The fastest of ``repeats`` calls and the last call's result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    assert out is not None
    return min(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ds = load_dataset("mnist")
    x, y = to_tensor(ds.x_test, "mnist"), torch.as_tensor(ds.y_test, dtype=torch.long)
    model = build_model("lenet", 1, 10, seed=0)
    train(model, to_tensor(ds.x_train[:3000], "mnist"),
          torch.as_tensor(ds.y_train[:3000], dtype=torch.long),
          epochs=1, lr=0.02, momentum=0.5, batch_size=10, seed=0)
    t_base, base = best_of(args.repeats, lambda: evaluate_nchw(model, x, y))
    t_new, new = best_of(args.repeats, lambda: evaluate(model, x, y))
    print(f"nchw {t_base:.3f} s  channels-last {t_new:.3f} s  ratio {t_new / t_base:.2f}  "
          f"accuracy {base[1]:.4f} / {new[1]:.4f}  loss diff {abs(base[0] - new[0]):.2e}")
    if base[1] != new[1]:
        raise SystemExit("accuracies differ")


if __name__ == "__main__":
    main()
