"""Guards on the round's aggregate against backdoors: the robust learning rate's sign vote and
FLAME's noise.

A backdoor lives in coordinates that the attackers push the same way and the honest clients do
not agree on. The robust learning rate (Ozdayi, Kantarcioglu, Gel, AAAI 2021) counts, per
coordinate, the signs of the round's updates: where ``|sum_i sign(delta_i)|`` is below the
threshold theta, the server's step on that coordinate is reversed (learning rate -1 instead
of +1), so a direction only a minority teaches is unlearned rather than accumulated. FLAME
(Nguyen et al., USENIX Security 2022) adds Gaussian noise of standard deviation
``lambda x S`` to the aggregate, ``S`` the median norm of the round's updates, which erodes
what a few rounds of poisoned updates wrote. Both act after the valuation's weights have
averaged the round, so phi and the ledger are those of the updates as sent.

Pure functions of the states and a generator; :class:`RobustLR` is the ``robust-lr`` step of
the defence list (the noise's is :mod:`fedowen_strategy.defences.noise`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.base import Guard, Settled, Settling
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.updates import State, update_keys, update_norm, work_dtype


def sign_agreement(deltas: NDArray[np.floating]) -> NDArray[np.float64]:
    """``|sum_i sign(delta_i)|`` per coordinate of ``deltas`` (updates stacked on axis 0)."""
    return np.abs(np.sign(deltas).sum(axis=0, dtype=np.float64))


def robust_lr_mask(deltas: NDArray[np.floating], threshold: int) -> NDArray[np.float64]:
    """Per coordinate, +1 where at least ``threshold`` more updates agree on the sign than
    disagree, else -1 (the server's learning rate there; the paper's Eq. 3)."""
    return np.where(sign_agreement(deltas) >= threshold, 1.0, -1.0)


def guard_aggregate(average: Mapping[str, NDArray], states: Sequence[State],
                    global_state: State, *, robust_lr_threshold: int, aggregate_noise: float,
                    rng: np.random.Generator) -> tuple[dict[str, NDArray], dict[str, Any]]:
    """The round's new global model after the sign vote and the noise (each off at 0), and
    what they did for the round record: the share of coordinates whose step was reversed
    (``robust_lr_reversed``) and the noise's standard deviation (``aggregate_noise_std``).
    Counters (integer arrays) pass through untouched."""
    out = {k: np.asarray(v) for k, v in average.items()}
    record: dict[str, Any] = {}
    if not states or (robust_lr_threshold <= 0 and aggregate_noise <= 0):
        return out, record
    keys = update_keys(global_state)
    if robust_lr_threshold > 0:
        reversed_, total = 0, 0
        for key in keys:  # in the model's float type (fedowen_strategy.updates)
            ref = np.asarray(global_state[key])
            dtype = work_dtype(ref, *(s[key] for s in states))
            mask = robust_lr_mask(np.stack([np.subtract(s[key], ref, dtype=dtype)
                                            for s in states]), robust_lr_threshold)
            step = np.subtract(out[key], ref, dtype=dtype)
            step *= mask.astype(dtype)
            out[key] = (step + ref).astype(ref.dtype, copy=False)
            reversed_ += int(np.count_nonzero(mask < 0))
            total += mask.size
        record["robust_lr_reversed"] = reversed_ / max(total, 1)
    if aggregate_noise > 0:
        std = aggregate_noise * float(np.median([update_norm(s, global_state) for s in states]))
        for key in keys:
            noise = rng.normal(0.0, std, size=global_state[key].shape)
            out[key] = (out[key] + noise).astype(global_state[key].dtype)
        record["aggregate_noise_std"] = std
    return out, record


class RobustLR(Guard):
    """``robust-lr``: the sign vote on the round's aggregate at ``robust-lr-threshold`` (0, the
    default: off; recorded: ``robust_lr_reversed``)."""

    name = "robust-lr"

    def settle(self, state: dict[str, NDArray], settling: Settling) -> Settled:
        return guard_aggregate(state, settling.states, settling.view.global_state,
                               robust_lr_threshold=settling.view.guards.robust_lr_threshold,
                               aggregate_noise=0.0, rng=settling.rng)

    def summary(self, guards: Guards) -> str:
        return f"robust-lr (theta={guards.robust_lr_threshold}; 0: off)"
