"""Local training and evaluation on in-memory tensors (plain SGD, cross-entropy).

Both functions take whole tensors, as the client partitions and the server sets are small
enough to hold in memory; batches are moved to ``device`` one at a time. Training is
deterministic given ``seed``: the shuffling uses its own ``torch.Generator`` and any other
randomness in the model (dropout) draws from a forked, seeded torch RNG, so the global RNG is
left as it was.
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from fedowen_task.recipe import TrainConfig

log = logging.getLogger(__name__)


def _device_of(model: nn.Module, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled index batches; a final batch of one sample joins the previous one.

    A batch of one breaks BatchNorm in training mode (one value per channel after ResNet's
    last stage); folding it in keeps every sample while avoiding that.
    """
    batches = list(torch.randperm(n, generator=generator).split(batch_size))
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2:] = [torch.cat(batches[-2:])]
    return batches


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    momentum: float,
    batch_size: int,
    seed: int,
    weight_decay: float = 0.0,
    proximal_mu: float = 0.0,
    device: torch.device | str | None = None,
    loss_squares: bool = False,
    grad_variance: bool = False,
) -> dict[str, float]:
    """Train ``model`` in place with SGD on cross-entropy (plus FedProx's proximal term).

    Parameters
    ----------
    model : nn.Module
    x, y : torch.Tensor
        Inputs ``(N, C, H, W)`` (float, already standardised) and integer labels ``(N,)``.
    epochs, lr, momentum, batch_size, weight_decay
        See :class:`~fedowen_task.recipe.TrainConfig`.
    seed : int
        Seeds the shuffling and any randomness inside the model.
    proximal_mu : float
        FedProx (Li et al., MLSys 2020): adds ``mu / 2 * ||w - w_start||^2`` to every batch's
        loss, ``w_start`` being the received weights; 0 is plain SGD. The reported loss is the
        cross-entropy alone.
    device : torch.device or str, optional
        Where to train; ``None`` keeps the model where it is.
    loss_squares : bool
        Also sum the squared per-sample losses of every sample seen (Oort's statistical
        utility), from the same logits, outside the graph: training is unchanged.
    grad_variance : bool
        Also measure the variance of the per-step gradients (DELTA's local variance,
        :class:`GradientMoments`) from the gradients each step computes anyway, outside the
        graph: training is unchanged; it costs one parameter-sized buffer and one pass over
        the gradients per step.

    Returns
    -------
    dict
        ``loss``: mean training loss over all samples seen (every epoch);
        ``num_examples``: ``N``; ``step_scale``: how far a constant unit gradient would have
        moved the model (:func:`step_scale`); with ``loss_squares`` also
        ``loss_squares``, with ``grad_variance`` also ``grad_variance``.
    """
    TrainConfig(lr, momentum, batch_size, epochs, weight_decay)  # validates
    if not proximal_mu >= 0:
        raise ValueError(f"proximal_mu={proximal_mu} must be >= 0 (FedProx's mu; 0 = off)")
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"x and y must be non-empty and of equal length, got {len(x)}, {len(y)}")
    dev = _device_of(model, device)
    model.to(dev).train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
    )
    start = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else []
    generator = torch.Generator().manual_seed(seed)
    loss_fn = nn.CrossEntropyLoss()
    total, seen, squares, steps = 0.0, 0, 0.0, 0
    moments = GradientMoments(model) if grad_variance else None
    fork_devices = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        for _ in range(epochs):
            for idx in _batches(len(x), batch_size, generator):
                xb, yb = x[idx].to(dev), y[idx].to(dev, dtype=torch.long)
                optimizer.zero_grad(set_to_none=True)
                logits = model(xb)
                loss = loss_fn(logits, yb)
                if loss_squares:
                    with torch.no_grad():
                        per = nn.functional.cross_entropy(logits, yb, reduction="none")
                        squares += float((per.double() ** 2).sum())
                objective = loss + _proximal(model, start, proximal_mu) if start else loss
                objective.backward()
                if moments is not None:
                    moments.add()
                optimizer.step()
                total += float(loss.detach()) * len(idx)
                seen += len(idx)
                steps += 1
    stats: dict[str, float] = {"loss": total / seen, "num_examples": len(x),
                               "step_scale": step_scale(lr, momentum, steps)}
    if loss_squares:
        stats["loss_squares"] = squares
    if moments is not None:
        stats["grad_variance"] = moments.variance()
    return stats


def step_scale(lr: float, momentum: float, steps: int) -> float:
    """How far ``steps`` of torch's SGD move a parameter under a constant unit gradient: the
    momentum buffer starts empty each round (``b_1 = g``, ``b_t = momentum b_{t-1} + g``), so
    step ``t`` moves ``lr (1 - m^t) / (1 - m)`` and the sum is
    ``lr / (1 - m) (steps - m (1 - m^steps) / (1 - m))``: ``lr`` for one step, tending to
    ``lr steps / (1 - m)`` as the steps grow (no weight decay)."""
    m = momentum
    if m == 0.0:
        return lr * steps
    return lr / (1.0 - m) * (steps - m * (1.0 - m ** steps) / (1.0 - m))


class GradientMoments:
    """Running moments of a model's per-step gradients (DELTA's local variance).

    :meth:`add` after each ``backward``: the gradients' running sum (one buffer the size of
    the parameters) and the running sum of their squared norms. :meth:`variance` is
    ``mean_b ||g_b||^2 - ||mean_b g_b||^2`` over the ``steps`` added, i.e. the mean squared
    distance of a step's gradient from the mean gradient of the local trajectory (summed over
    the parameters; the gradient of the training objective, FedProx's term included when it
    is on). Read outside the graph: training is unchanged.
    """

    def __init__(self, model: nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.sums = [torch.zeros_like(p) for p in self.params]
        self.squares, self.steps = 0.0, 0

    @torch.no_grad()
    def add(self) -> None:
        """Add the gradients the last ``backward`` left (a parameter without one: zero)."""
        norms = []
        for total, p in zip(self.sums, self.params, strict=True):
            if p.grad is not None:
                total.add_(p.grad)
                norms.append(p.grad.pow(2).sum())
        if norms:
            self.squares += float(torch.stack(norms).sum())
        self.steps += 1

    @torch.no_grad()
    def variance(self) -> float:
        """``mean ||g_b||^2 - ||mean g_b||^2`` (0 before two steps; never below 0)."""
        if self.steps == 0:
            return 0.0
        mean_sq = sum(float((t / self.steps).pow(2).sum()) for t in self.sums)
        return max(self.squares / self.steps - mean_sq, 0.0)


def _proximal(model: nn.Module, start: list[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx's ``mu / 2 * ||w - w_start||^2`` over the trainable parameters."""
    squares = [((p - w0) ** 2).sum() for p, w0 in zip(model.parameters(), start, strict=True)]
    return 0.5 * mu * torch.stack(squares).sum()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 1024,
    device: torch.device | str | None = None,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` (in eval mode) on ``(x, y)``.

    Returns
    -------
    tuple of float
        ``(loss, accuracy)``, accuracy in ``[0, 1]``.
    """
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"x and y must be non-empty and of equal length, got {len(x)}, {len(y)}")
    dev = _device_of(model, device)
    model.to(dev).eval()
    layout = torch.contiguous_format
    if x.dim() == 4 and dev.type == "cpu":
        # Convolutions run faster in channels-last on the CPU (docs/benchmarks.md); a copy,
        # so the caller's parameters keep their layout.
        layout = torch.channels_last
        model = copy.deepcopy(model).to(memory_format=layout)
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size].to(dev).contiguous(memory_format=layout)
        yb = y[start : start + batch_size].to(dev, dtype=torch.long)
        logits = model(xb)
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(dim=1) == yb).sum())
    return loss_sum / len(x), correct / len(x)
