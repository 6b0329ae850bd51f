"""``alignins``: AlignIns (Xu et al., "Detecting Backdoor Attacks in Federated Learning via
Direction Alignment Inspection", CVPR 2025; public code JiiahaoXU/AlignIns,
``src/aggregation.py``, ``agg_alignins``).

A backdoor's update has to carry the trigger's direction, and that shows in two alignments the
honest majority shares: its temporal direction alignment (TDA: the cosine between the update
and the global model it started from) and its masked principal sign alignment ratio (MPSA:
the share of its top-k coordinates by magnitude whose sign is the round's majority sign,
``sign(sum_i sign(delta_i))``). Each is turned into a robust z-score over the round,
``|x - median| / std``, and an update is kept only when both z-scores are below their
thresholds (``alignins-lambda-c`` for TDA, ``alignins-lambda-s`` for MPSA; strictly below, as
the public code's ``<``). The kept updates are then clipped to the median norm of the kept
ones (post-filtering clipping) and the strategy averages them.

Differences from the public code (docs/defences.md): the vectors are the update keys
(floating, not BatchNorm statistics: :func:`fedowen_strategy.updates.update_keys`) of the
update and of the global model, where the public code flattens the whole state dict (buffers
and counters too); a round whose values are all equal (std 0) has every z-score 0 (all kept),
where the public code divides by zero and keeps none; the top-k holds at least one coordinate.
Pure functions of the updates; the guard keeps no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView
from fedowen_strategy.defences.bounds import clip_state
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.updates import flat_deltas, flatten, update_keys

#: torch.nn.CosineSimilarity's eps in the public code: the norms' product is at least this.
COSINE_EPS = 1e-6


def direction_alignment(flat: NDArray[np.floating], direction: NDArray[np.floating]
                        ) -> NDArray[np.float64]:
    """TDA: each row's cosine with ``direction`` (the global model), in float64, the norms'
    product floored at :data:`COSINE_EPS` as torch's ``CosineSimilarity`` does."""
    rows = np.asarray(flat, dtype=np.float64)
    ref = np.asarray(direction, dtype=np.float64)
    dots = rows @ ref
    norms = np.linalg.norm(rows, axis=1) * np.linalg.norm(ref)
    return np.asarray(dots / np.maximum(norms, COSINE_EPS))


def sign_alignment(flat: NDArray[np.floating], sparsity: float) -> NDArray[np.float64]:
    """MPSA: per row, the share of its ``max(1, int(d x sparsity))`` largest coordinates by
    magnitude whose sign is the rows' majority sign there (``sign`` of the summed signs; a
    tie is sign 0, which only a 0 coordinate matches)."""
    signs = np.sign(flat)
    major = np.sign(signs.sum(axis=0))
    k = max(1, int(flat.shape[1] * sparsity))
    out = np.empty(len(flat), dtype=np.float64)
    for i, row in enumerate(flat):
        top = np.argpartition(-np.abs(row), k - 1)[:k]
        out[i] = float(np.mean(signs[i, top] == major[top]))
    return out


def z_scores(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """AlignIns' MZ-score: ``|x - median| / std`` (population std, as ``np.std``); all 0 when
    the values do not spread (std 0)."""
    spread = float(np.std(values))
    if spread == 0.0:
        return np.zeros(len(values))
    return np.asarray(np.abs(values - np.median(values)) / spread)


def alignins_keep(tda: NDArray[np.float64], mpsa: NDArray[np.float64], lambda_c: float,
                  lambda_s: float) -> NDArray[np.bool_]:
    """The rows both of whose z-scores are strictly below their thresholds."""
    return np.asarray((z_scores(tda) < lambda_c) & (z_scores(mpsa) < lambda_s))


def median_clip(norms: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
    """Per norm, the factor ``min(1, clip / norm)`` with ``clip`` the lower median of
    ``norms`` (torch's ``median``, which the public code calls), and ``clip``."""
    clip = float(np.sort(norms)[(len(norms) - 1) // 2])
    factors = np.where(norms > clip, clip / np.where(norms > 0, norms, 1.0), 1.0)
    return factors, clip


def inspect(states: Sequence[Mapping[str, NDArray]], global_state: Mapping[str, NDArray],
            guards: Guards) -> dict[str, Any]:
    """The round's AlignIns measurements: ``tda``, ``mpsa``, their z-scores, ``keep`` (a mask
    over ``states``) and the kept updates' norms (``norms``)."""
    flat = flat_deltas(states, global_state)
    tda = direction_alignment(flat, flatten(global_state, update_keys(global_state)))
    mpsa = sign_alignment(flat, guards.alignins_sparsity)
    keep = alignins_keep(tda, mpsa, guards.alignins_lambda_c, guards.alignins_lambda_s)
    norms = np.linalg.norm(np.asarray(flat, dtype=np.float64), axis=1)
    return {"tda": tda, "mpsa": mpsa, "tda_z": z_scores(tda), "mpsa_z": z_scores(mpsa),
            "keep": keep, "norms": norms}


class AlignIns(Guard):
    """AlignIns' filter and post-filtering clip (recorded: ``alignins`` with each client's
    TDA, MPSA, their z-scores and the clip norm; ``clipped``: the factors applied)."""

    name = "alignins"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        if not round_.updates:
            return round_
        g = view.guards
        found = inspect([u.state for u in round_.updates], view.global_state, g)
        ids = [u.client_id for u in round_.updates]
        kept = []
        for i, upd in enumerate(round_.updates):
            if found["keep"][i]:
                kept.append(i)
                continue
            round_.rejected[upd.client_id] = (
                f"AlignIns: TDA z-score {found['tda_z'][i]:.3g} (lambda-c {g.alignins_lambda_c:g})"
                f", MPSA z-score {found['mpsa_z'][i]:.3g} (lambda-s {g.alignins_lambda_s:g}); "
                "kept only below both")
        record: dict[str, Any] = {
            name: dict(zip(ids, (float(v) for v in found[name]), strict=True))
            for name in ("tda", "mpsa", "tda_z", "mpsa_z")}
        updates = []
        if kept:
            factors, clip = median_clip(found["norms"][kept])
            record["norm_clip"] = clip
            for i, factor in zip(kept, factors, strict=True):
                upd = round_.updates[i]
                if factor < 1.0:
                    round_.clipped[upd.client_id] = float(factor)
                    upd = replace(upd, state=clip_state(upd.state, view.global_state,
                                                        float(factor)), norm=None)
                updates.append(upd)
        round_.updates = updates
        round_.record["alignins"] = record
        return round_

    def summary(self, guards: Guards) -> str:
        return (f"alignins (sparsity {guards.alignins_sparsity:g}, lambda-s "
                f"{guards.alignins_lambda_s:g}, lambda-c {guards.alignins_lambda_c:g})")
