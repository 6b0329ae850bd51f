"""``aggregate-noise``: FLAME's Gaussian noise on the round's aggregate, standard deviation
``aggregate-noise`` x the round's median update norm (the paper's lambda, 0.001; 0, the
default: off; :func:`fedowen_strategy.defences.robust_lr.guard_aggregate`). Drawn from the
round's generator (FedOwen's valuation stream, after the valuation)."""

from __future__ import annotations

from numpy.typing import NDArray

from fedowen_strategy.defences.base import Guard, Settled, Settling
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.robust_lr import guard_aggregate


class AggregateNoise(Guard):
    """The noise (recorded: ``aggregate_noise_std``)."""

    name = "aggregate-noise"

    def settle(self, state: dict[str, NDArray], settling: Settling) -> Settled:
        return guard_aggregate(state, settling.states, settling.view.global_state,
                               robust_lr_threshold=0,
                               aggregate_noise=settling.view.guards.aggregate_noise,
                               rng=settling.rng)

    def summary(self, guards: Guards) -> str:
        return f"aggregate-noise (x{guards.aggregate_noise:g} the median norm; 0: off)"
