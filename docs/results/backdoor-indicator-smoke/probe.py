"""The planting alone, on a trained model: the indicator planted (the ServerApp's own guard:
Fashion-MNIST's 800 -> 768 samples, seed 0) into the defaults arm's round-10 MNIST LeNet, at
the given settings, its record printed (strongest label accuracy before and after, the mean
over labels, the planting's norm).

``python docs/results/backdoor-indicator-smoke/probe.py OUT/defaults EPOCHS,LR,MU ...``
"""

from __future__ import annotations

import sys
import time

import torch

from fedowen_strategy.defences.base import Dispatching
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_task.models import build_model
from server_app.indicator import indicator_guard
from server_app.store.checkpoint import load_checkpoint


def main(run: str, settings: list[str]) -> None:
    torch.set_num_threads(1)
    state = dict(load_checkpoint(run).global_state)
    model = build_model("lenet", 1, 10, seed=0)
    for text in settings:
        epochs, lr, mu = text.split(",")
        guards = Guards(indicator_epochs=int(epochs), indicator_lr=float(lr),
                        indicator_mu=float(mu))
        guard = indicator_guard(model, torch.zeros(2, 1, 28, 28), torch.device("cpu"),
                                dataset="mnist", ood="auto", samples=800, seed=0)
        start = time.perf_counter()
        guard.dispatch(dict(state), Dispatching(11, guards))
        assert guard.planted is not None
        record = {k: round(v, 4) if isinstance(v, float) else v
                  for k, v in guard.planted.record.items()}
        print(f"epochs {epochs} lr {lr} mu {mu}: {record} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
