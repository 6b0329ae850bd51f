"""A backdoor's trigger and its metric (issue 45): stamp, poison, attack success rate.

A backdoor attacker stamps a small trigger (a white ``square`` or ``plus`` of ``size`` pixels
at a corner or the centre) on a share of its training images, relabels them to the target
class, trains as usual and sends its (boosted) update. The global model keeps its clean
accuracy and learns to send any stamped input to the target. The metric is the **attack
success rate**: of the test images whose true class is not the target, the share classified as
the target once stamped (Bagdasaryan et al. 2020; BackFed's definition, which excludes the
target class so a model that always answers the target is not credited with its share of
it). Images are the standardised tensors of :func:`fedowen_task.data.to_tensor`; "white" is
the value a pixel of intensity 1.0 takes there, per channel.
"""

from __future__ import annotations

import numpy as np
import torch

from fedowen_task.adversary.keys import Trigger


def trigger_mask(trigger: Trigger, height: int, width: int) -> torch.Tensor:
    """``(height, width)`` booleans: the trigger's pixels."""
    if trigger.size + 2 > min(height, width):
        raise ValueError(f"adversary-trigger-size={trigger.size} does not fit a "
                         f"{height}x{width} image with a one-pixel margin")
    top, left = {"bottom-right": (height - 1 - trigger.size, width - 1 - trigger.size),
                 "top-left": (1, 1),
                 "center": ((height - trigger.size) // 2, (width - trigger.size) // 2)
                 }[trigger.position]
    box = torch.ones(trigger.size, trigger.size, dtype=torch.bool)
    if trigger.shape == "plus":
        box[:] = False
        box[trigger.size // 2, :] = True
        box[:, trigger.size // 2] = True
    out = torch.zeros(height, width, dtype=torch.bool)
    out[top:top + trigger.size, left:left + trigger.size] = box
    return out


def stamp(x: torch.Tensor, trigger: Trigger, value: torch.Tensor) -> torch.Tensor:
    """A copy of the images ``(N, C, H, W)`` with the trigger's pixels set to ``value``
    (every channel)."""
    out = x.clone()
    mask = trigger_mask(trigger, x.shape[-2], x.shape[-1])
    out[:, :, mask] = value.view(-1, 1).to(out.dtype)
    return out


def poison(x: torch.Tensor, y: torch.Tensor, trigger: Trigger, value: torch.Tensor,
           rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Stamp and relabel ``round(poison_fraction * N)`` images drawn without replacement by
    ``rng`` (at least one); returns the new images, labels and the poisoned indices."""
    n = len(y)
    count = max(1, round(trigger.poison_fraction * n))
    idx = np.sort(rng.choice(n, size=count, replace=False))
    x, y = x.clone(), y.clone()
    chosen = torch.as_tensor(idx)
    x[chosen] = stamp(x[chosen], trigger, value)
    y[chosen] = trigger.target
    return x, y, idx


@torch.no_grad()
def attack_success(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   trigger: Trigger, value: torch.Tensor, batch_size: int = 1024) -> float:
    """Share of the images of a class other than the target that the model, once they are
    stamped, classifies as the target (NaN when every image is of the target class)."""
    keep = y != trigger.target
    if not bool(keep.any()):
        return float("nan")
    model.eval()
    device = next(model.parameters()).device
    hits = 0
    xs = x[keep]
    for start in range(0, len(xs), batch_size):
        batch = stamp(xs[start:start + batch_size], trigger, value).to(device)
        hits += int((model(batch).argmax(dim=1) == trigger.target).sum())
    return hits / int(keep.sum())
