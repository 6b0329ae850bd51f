"""A backdoor's trigger and its metric (issue 45): stamp, poison, attack success rate.

A backdoor attacker stamps a small trigger (a white ``square`` or ``plus`` of ``size`` pixels
at a corner or the centre, or DBA's ``bars``) on a share of its training images, relabels them
to the target class, trains as usual and sends its (boosted) update. A DBA attacker (Xie et
al., ICLR 2020) stamps one ``part`` of the bars alone, the one its rank names; the test
stamps the whole pattern. The global model keeps its clean
accuracy and learns to send any stamped input to the target. The metric is the **attack
success rate**: of the test images whose true class is not the target, the share classified as
the target once stamped (Bagdasaryan et al. 2020; BackFed's definition, which excludes the
target class so a model that always answers the target is not credited with its share of
it). Images are the standardised tensors of :func:`fedowen_task.data.to_tensor`; "white" is
the value a pixel of intensity 1.0 takes there, per channel.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedowen_task.adversary.keys import Trigger


def trigger_box(trigger: Trigger, part: int | None = None) -> torch.Tensor:
    """The trigger's bounding box, ``(box height, box width)`` booleans: its pixels, or with
    ``part`` (``bars`` only) that one bar's pixels alone, where the whole pattern puts it.

    Raises
    ------
    ValueError
        For a ``part`` of a shape other than ``bars``, or one outside ``0..parts - 1``.
    """
    size = trigger.size
    if trigger.shape != "bars":
        if part is not None:
            raise ValueError(f"adversary-trigger={trigger.shape!r} has no parts (DBA splits "
                             "the 'bars' trigger)")
        box = torch.ones(size, size, dtype=torch.bool)
        if trigger.shape == "plus":
            box[:] = False
            box[size // 2, :] = True
            box[:, size // 2] = True
        return box
    if part is not None and not 0 <= part < trigger.parts:
        raise ValueError(f"part {part} is not a bar of a {trigger.parts}-bar trigger "
                         f"(0..{trigger.parts - 1})")
    columns = math.ceil(math.sqrt(trigger.parts))
    rows = math.ceil(trigger.parts / columns)
    box = torch.zeros((rows - 1) * (trigger.gap + 1) + 1,
                      columns * size + (columns - 1) * trigger.gap, dtype=torch.bool)
    for bar in range(trigger.parts) if part is None else (part,):
        top, left = (bar // columns) * (trigger.gap + 1), (bar % columns) * (size + trigger.gap)
        box[top, left:left + size] = True
    return box


def trigger_mask(trigger: Trigger, height: int, width: int, part: int | None = None
                 ) -> torch.Tensor:
    """``(height, width)`` booleans: the trigger's pixels (:func:`trigger_box`, ``part``
    alone when given), its box one pixel from the corner or centred."""
    box = trigger_box(trigger, part)
    bh, bw = box.shape
    if bh + 2 > height or bw + 2 > width:
        raise ValueError(f"adversary-trigger={trigger.shape!r} of adversary-trigger-size="
                         f"{trigger.size} ({bh}x{bw} pixels) does not fit a {height}x{width} "
                         "image with a one-pixel margin")
    top, left = {"bottom-right": (height - 1 - bh, width - 1 - bw),
                 "top-left": (1, 1),
                 "center": ((height - bh) // 2, (width - bw) // 2)}[trigger.position]
    out = torch.zeros(height, width, dtype=torch.bool)
    out[top:top + bh, left:left + bw] = box
    return out


def stamp(x: torch.Tensor, trigger: Trigger, value: torch.Tensor, part: int | None = None
          ) -> torch.Tensor:
    """A copy of the images ``(N, C, H, W)`` with the trigger's pixels (``part``'s alone, when
    given) set to ``value`` (every channel)."""
    out = x.clone()
    mask = trigger_mask(trigger, x.shape[-2], x.shape[-1], part)
    out[:, :, mask] = value.view(-1, 1).to(out.dtype)
    return out


def poison(x: torch.Tensor, y: torch.Tensor, trigger: Trigger, value: torch.Tensor,
           rng: np.random.Generator, part: int | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Stamp (``part`` alone, when given) and relabel ``round(poison_fraction * N)`` images
    drawn without replacement by ``rng`` (at least one); returns the new images, labels and
    the poisoned indices."""
    n = len(y)
    count = max(1, round(trigger.poison_fraction * n))
    idx = np.sort(rng.choice(n, size=count, replace=False))
    x, y = x.clone(), y.clone()
    chosen = torch.as_tensor(idx)
    x[chosen] = stamp(x[chosen], trigger, value, part)
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
