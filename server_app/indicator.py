"""The ServerApp's side of BackdoorIndicator: its out-of-distribution samples and the bound
guard (:mod:`fedowen_strategy.defences.indicator`).

The public code plants CIFAR-100 (or EMNIST, 300K random images, noise) into its CIFAR-10
model and CIFAR-10 into its EMNIST one; none of those is offline here, so the samples come from
another dataset of the offline set (``indicator-ood``, ``auto``: :data:`OOD_FOR`):
Fashion-MNIST for MNIST, FEMNIST and MedMNIST, MNIST for Fashion-MNIST, and FEMNIST (the
nearest to the public code's EMNIST) for CIFAR-10. ``indicator-samples`` of its training
images are drawn, seeded, rounded down to whole batches of 64 (the public code's loader drops
the last partial batch), standardised as their own dataset's, centred in the task's image size
with black borders and repeated over its channels (the public code repeats EMNIST's channel
for CIFAR-10 and pads it by random crops), and given labels balanced over the task's classes
in a seeded shuffle (its ``_get_ood_dataloader``). A pairing whose images cannot become the
task's (more channels, or larger) or that is the task's own dataset is an error naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedowen_strategy.defences.indicator import Indicator
from fedowen_strategy.defences.indicator_task import BATCH_SIZE, TorchIndicator
from fedowen_task.data import DatasetArrays, canonical_name, load_dataset, resolve_data_dir
from fedowen_task.data import to_tensor as standardised

#: ``indicator-ood = "auto"``: the task's dataset (family) -> the indicator's.
OOD_FOR = {"mnist": "fashion-mnist", "fashion-mnist": "mnist", "femnist": "fashion-mnist",
           "medmnist": "fashion-mnist", "cifar10": "femnist"}
AUTO = "auto"


def ood_dataset(dataset: str, ood: str) -> str:
    """``indicator-ood`` resolved for the task's ``dataset`` (a canonical name)."""
    if ood == AUTO:
        return canonical_name(OOD_FOR[canonical_name(dataset).split(":", 1)[0]])
    return canonical_name(ood)


def ood_problems(dataset: str, ood: str) -> list[str]:
    """What is wrong with ``indicator-ood`` for the task's ``dataset``: not a dataset, or the
    task's own (its samples would be in distribution). A wrong ``dataset`` is its own key's
    problem."""
    try:
        name = ood if ood == AUTO else canonical_name(ood)
    except ValueError as err:
        return [f"indicator-ood={ood!r}: {err} Or \"auto\" (server_app.indicator.OOD_FOR)."]
    try:
        task = canonical_name(dataset)
    except ValueError:
        return []
    if ood_dataset(task, name) == task:
        return [f"indicator-ood={ood!r} is the task's own dataset ({task}): its samples are not "
                f"out of distribution; use \"auto\" ({OOD_FOR[task.split(':', 1)[0]]}) or "
                "another dataset"]
    return []


def fitted(x: np.ndarray, shape: Sequence[int], names: tuple[str, str]) -> np.ndarray:
    """``x`` (``(N, c, h, w)``) centred in the task's ``shape`` ``(C, H, W)`` with black
    borders (an image no larger, with as many channels or one); else a ``ValueError`` naming
    the pairing (``names``: the OOD dataset's and the task's)."""
    c, h, w = x.shape[1:]
    channels, height, width = shape
    if c not in (1, channels) or h > height or w > width:
        raise ValueError(
            f"indicator-ood={names[0]!r} ({c}x{h}x{w} images) cannot be planted in a model of "
            f"{names[1]}'s {channels}x{height}x{width} images (the OOD images need as many "
            "channels or one, and no larger a size): set indicator-ood to a dataset that fits "
            f"or to \"auto\"")
    top, left = (height - h) // 2, (width - w) // 2
    out = np.zeros((len(x), c, height, width), dtype=x.dtype)
    out[:, :, top:top + h, left:left + w] = x
    return out


def indicator_samples(ood: DatasetArrays, shape: Sequence[int], num_classes: int, count: int,
                      seed: int, task_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The indicator's samples, shaped as the task's images, and their assigned labels (module
    docstring)."""
    kept = count // BATCH_SIZE * BATCH_SIZE
    if kept > len(ood.y_train) or kept < num_classes:
        raise ValueError(
            f"indicator-samples={count} keeps {kept} (whole batches of {BATCH_SIZE}) of "
            f"{ood.name}'s {len(ood.y_train)} training images for {num_classes} classes: it "
            f"must keep at most all of them and at least one a class")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x1D1C]))
    idx = np.sort(rng.choice(len(ood.y_train), kept, replace=False))
    x = standardised(fitted(ood.x_train[idx], shape, (ood.name, task_name)), ood.name)
    labels = np.resize(np.arange(num_classes), kept)
    rng.shuffle(labels)
    return x.expand(-1, shape[0], -1, -1).contiguous(), torch.as_tensor(labels, dtype=torch.long)


def output_classes(model: torch.nn.Module, example: torch.Tensor) -> int:
    """How many classes ``model`` scores (its output width on one ``example``, evaluation
    mode; the model's mode is restored)."""
    mode = model.training
    model.eval()
    with torch.no_grad():
        width = int(model(example[:1]).shape[1])
    model.train(mode)
    return width


def indicator_guard(model: torch.nn.Module, x_task: torch.Tensor, device: torch.device, *,
                    dataset: str, ood: str, samples: int, seed: int, data_dir: str = "",
                    download: bool = False) -> Indicator:
    """The ``indicator`` guard with its task: ``model`` (the run's architecture, scoring
    images like ``x_task``) and ``samples`` images of ``ood`` for the task's ``dataset``."""
    if bad := ood_problems(dataset, ood):
        raise ValueError("; ".join(bad))
    name = ood_dataset(dataset, ood)
    arrays = load_dataset(name, resolve_data_dir(data_dir or None), download=download)
    x, y = indicator_samples(arrays, tuple(x_task.shape[1:]), output_classes(model, x_task),
                             samples, seed, canonical_name(dataset))
    return Indicator(TorchIndicator(model, x, y, seed=seed, device=device))
