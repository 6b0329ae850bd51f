"""Reference coalition utility: the slow, obviously-correct per-coalition evaluation.

A test oracle: ``tests/test_utility.py`` checks
:class:`fedowen_strategy.torch_utility.batched.CoalitionGame` against it, and
``benchmarks/bench_utility.py`` times both. Test code only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedowen_strategy.torch_utility.batched import check_masks, score_sum
from fedowen_task.models import load_numpy_state


def average_states(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Weighted average of floating arrays (float64, cast back); max of integer arrays."""
    w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    out = {}
    for key, first in states[0].items():
        stacked = np.stack([np.asarray(s[key]) for s in states])
        if np.issubdtype(first.dtype, np.floating):
            out[key] = np.tensordot(w, stacked.astype(np.float64), axes=1).astype(first.dtype)
        else:
            out[key] = stacked.max(axis=0)
    return out


def naive_utility(
    model: nn.Module,
    global_state: Mapping[str, np.ndarray],
    client_states: Sequence[Mapping[str, np.ndarray]],
    num_examples: Sequence[int],
    x_eval: torch.Tensor,
    y_eval: torch.Tensor,
    masks: np.ndarray,
    metric: str = "accuracy",
    batch_size: int = 256,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """Reference utility: per coalition, average state dicts, load them, run a forward pass.

    Slow on purpose (one ``load_state_dict`` per coalition, no caching); used by the tests and
    the benchmark to check and time ``CoalitionGame``.
    """
    masks = check_masks(masks, len(client_states))
    net = copy.deepcopy(model).to(device).eval()
    x_eval, y_eval = x_eval.to(device), y_eval.to(device, torch.long)
    values = np.empty(len(masks), dtype=np.float64)
    for j, mask in enumerate(masks):
        members = np.flatnonzero(mask).tolist()
        state = (
            dict(global_state)
            if len(members) == 0
            else average_states(
                [client_states[i] for i in members], [num_examples[i] for i in members]
            )
        )
        load_numpy_state(net, state)
        total = 0.0
        with torch.inference_mode():
            for s in range(0, len(x_eval), batch_size):
                logits = net(x_eval[s : s + batch_size])
                total += float(score_sum(logits, y_eval[s : s + batch_size], metric))
        values[j] = total / len(x_eval)
    return values
