"""Adversarial clients for robustness experiments (simulation only).

A seeded fraction of the partitions misbehaves in one of three ways:

- ``label-flip``: trains honestly on labels mapped ``y -> C - 1 - y`` (a poisoned update);
- ``noise``: returns the global model plus i.i.d. Gaussian noise of std ``noise_std`` instead
  of a trained update (a random update);
- ``free-rider``: returns the global model unchanged while claiming its examples (no work);
- ``sybil``: one actor behind many identities: every adversary trains on the data of the
  group's first partition with that partition's seed, so whenever two of them are selected in
  one round they return copies of one update (each under its own client id).

Which partitions are adversarial is a pure function of (num_partitions, fraction, seed), so
the benchmark that reads the records can name them without asking the clients.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

KINDS = ("label-flip", "noise", "free-rider", "sybil")


def adversary_ids(num_partitions: int, fraction: float, seed: int) -> frozenset[int]:
    """Partition ids of the ``round(fraction * num_partitions)`` adversaries."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"adversary-fraction={fraction!r} must lie in [0, 1]")
    count = round(fraction * num_partitions)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xAD]))
    return frozenset(int(i) for i in rng.permutation(num_partitions)[:count])


def sybil_master(adversaries: frozenset[int]) -> int:
    """The partition whose data and seed every Sybil copies (the smallest adversary id)."""
    if not adversaries:
        raise ValueError("sybil_master needs at least one adversary")
    return min(adversaries)


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``y -> C - 1 - y``: every label moves to another class (for C >= 2)."""
    return (num_classes - 1) - y


def noise_update(global_state: Mapping[str, torch.Tensor], noise_std: float,
                 seed: int) -> dict[str, torch.Tensor]:
    """The global model with Gaussian noise added to every floating tensor."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, value in global_state.items():
        if value.is_floating_point():
            out[key] = value + noise_std * torch.randn(value.shape, generator=gen,
                                                       dtype=value.dtype)
        else:
            out[key] = value.clone()
    return out
