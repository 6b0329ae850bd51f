"""``flame``: FLAME whole (Nguyen et al., "FLAME: Taming Backdoors in Federated Learning",
USENIX Security 2022, Algorithm 1), one step across screen and settle.

Screen: HDBSCAN on the pairwise cosine distances of the round's updates (min cluster size
``n // 2 + 1``, ``min_samples = 1``, one cluster allowed: :func:`fedowen_strategy.defences.
majority.cluster_labels`) admits the largest cluster (every update when no cluster forms or
fewer than 3 came); the clip bound ``S_t`` is the median L2 norm of *every* update the step
sees, admitted or not (the paper's ``MEDIAN(e_1, ..., e_n)``), and each admitted update is
scaled by ``min(1, S_t / ||u||)``. The strategy averages the admitted, clipped updates.

Settle: Gaussian noise of standard deviation ``flame-lambda x S_t`` (the paper's ``sigma =
lambda S_t``, lambda 0.001 for image classification) on each coordinate of the aggregate's
parameters (the update keys: :func:`fedowen_strategy.updates.update_keys`); BatchNorm's
running statistics and counters are left as the strategy combined them. Drawn from the
round's generator (FedOwen's valuation stream; :class:`~fedowen_strategy.defences.defended.
Defended`'s seeded one), as ``aggregate-noise`` draws. The settle step reads ``S_t`` from what
its screen recorded (:attr:`~fedowen_strategy.defences.base.Settling.screened`).

Recorded: ``rejected`` (the updates left out, with their cluster), ``clipped`` (the factors),
``flame`` (each client's cluster label and norm, the clip bound, how many were admitted) and
``flame_noise_std``. How this differs from the public codes: docs/defences.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView, Settled, Settling
from fedowen_strategy.defences.bounds import clip_state, norms_of
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.majority import (
    clip_to_median,
    cluster_labels,
    flame_noise,
    largest_cluster,
)
from fedowen_strategy.replies import ClientUpdate
from fedowen_strategy.updates import State, flat_deltas, update_keys


@dataclass(frozen=True)
class Admission:
    """What FLAME's screen decided for a round (aligned with its updates): HDBSCAN's labels,
    the mask admitted, every update's norm, the clip bound ``S_t`` (their median) and the clip
    factor ``min(1, S_t / norm)`` of each."""

    labels: NDArray[np.int64]
    admitted: NDArray[np.bool_]
    norms: NDArray[np.float64]
    clip_norm: float
    factors: NDArray[np.float64]


def admit(updates: Sequence[ClientUpdate], global_state: Mapping[str, NDArray]) -> Admission:
    """FLAME's clustering and clip bound over ``updates`` (see the module docstring); norms a
    step before measured (``ClientUpdate.norm``) are read, not measured again."""
    labels = cluster_labels(flat_deltas([u.state for u in updates], global_state))
    norms = np.asarray(norms_of(updates, global_state), dtype=np.float64)
    factors, clip_norm = clip_to_median(norms)
    return Admission(labels, largest_cluster(labels), norms, clip_norm, factors)


def add_noise(state: Mapping[str, NDArray], global_state: State, clip_norm: float,
              level: float, rng: np.random.Generator) -> dict[str, NDArray]:
    """``state`` with FLAME's noise, ``N(0, (level x clip_norm)^2)``
    (:func:`~fedowen_strategy.defences.majority.flame_noise`), added to every coordinate of
    its update keys (in ``global_state``'s order and dtype), every other array as it is; no
    draw when the standard deviation is 0."""
    out = {k: np.asarray(v) for k, v in state.items()}
    if level * clip_norm <= 0:
        return out
    for key in update_keys(global_state):
        ref = np.asarray(global_state[key])
        out[key] = (out[key] + flame_noise(ref.shape, clip_norm, rng, level)).astype(ref.dtype)
    return out


class Flame(Guard):
    """FLAME: cluster, clip to the median norm of every update, noise on the aggregate."""

    name = "flame"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        if not round_.updates:
            return round_
        found = admit(round_.updates, view.global_state)
        n, kept = len(round_.updates), int(found.admitted.sum())
        updates = []
        for i, upd in enumerate(round_.updates):
            if not found.admitted[i]:
                where = "noise" if found.labels[i] < 0 else f"cluster {found.labels[i]}"
                round_.rejected[upd.client_id] = (
                    f"FLAME: outside the largest HDBSCAN cluster of cosine distances ({where}; "
                    f"{kept} of {n} admitted, min cluster size {n // 2 + 1})")
            elif found.factors[i] < 1.0:
                round_.clipped[upd.client_id] = float(found.factors[i])
                updates.append(replace(upd, state=clip_state(
                    upd.state, view.global_state, float(found.factors[i])), norm=None))
            else:
                updates.append(replace(upd, norm=float(found.norms[i])))
        ids = [u.client_id for u in round_.updates]
        round_.record["flame"] = {
            "label": dict(zip(ids, map(int, found.labels), strict=True)),
            "norm": dict(zip(ids, map(float, found.norms), strict=True)),
            "clip_norm": found.clip_norm, "admitted": kept}
        round_.updates = updates
        return round_

    def settle(self, state: dict[str, NDArray], settling: Settling) -> Settled:
        screened = settling.screened.get("flame")
        if not isinstance(screened, Mapping) or "clip_norm" not in screened:
            raise ValueError("the flame step's noise needs the clip bound its screen recorded "
                             "(Settling.screened['flame']['clip_norm']): pass the screen "
                             "steps' record to the settle steps")
        level, clip_norm = settling.view.guards.flame_lambda, float(screened["clip_norm"])
        return (add_noise(state, settling.view.global_state, clip_norm, level, settling.rng),
                {"flame_noise_std": level * clip_norm})

    def summary(self, guards: Guards) -> str:
        return (f"flame (HDBSCAN majority of cosine distances, clip to the median norm, "
                f"noise x{guards.flame_lambda:g} it)")
