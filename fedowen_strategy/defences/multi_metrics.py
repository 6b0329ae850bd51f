"""``multi-metrics``: MultiMetrics (Huang et al., "Multi-metrics adaptively identifies backdoors
in federated learning", ICCV 2023; public code siquanhuang/Multi-metrics, ``defense.py``,
``Multi_metrics.exec``).

One distance misses what another sees: a backdoor can match the honest updates' length but
not their direction, or their direction but not their coordinates. Per client, three
distances to every other client are summed: the squared cosine distance ``(1 - cos)^2``, the
Manhattan distance ``||g_i - g_j||_1`` and the length difference ``| ||g_i|| - ||g_j|| |`` (the
public code's "Euclidean" metric). The three sums ``t_i`` are whitened by their covariance over
the round (``np.cov``, samples in rows), the score is ``t_i^T Sigma^-1 t_i`` (the public code
does not centre ``t_i``), and the ``multi-metrics-keep`` share of the round with the lowest
scores is kept (``int(keep x n)``, the public code's 0.3); the strategy averages them.

Differences from the public code (docs/defences.md): the vectors are the updates (update keys
minus the global model's: :func:`fedowen_strategy.updates.flat_deltas`), where the public
code's are the client models' parameters (the Manhattan distance is the same; the cosine and
the length difference are the updates', as AlignIns' re-implementation computes them); the
inverse is the pseudo-inverse (the same where the covariance is invertible; the public code
fails on a singular one, e.g. three clients or identical updates); at least one update is
kept (the public code averages none when ``int(keep x n)`` is 0); ties in score go to the
earlier client id (a stable sort, where ``np.argpartition`` leaves them unspecified); a zero
update has cosine 0 with every other (the public code divides by zero). Pure functions of the
updates; the guard keeps no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.updates import flat_deltas, gram_cosines, row_gram


def metric_sums(flat: NDArray[np.floating]) -> NDArray[np.float64]:
    """``(n, 3)``: per row, its summed squared cosine distance, Manhattan distance and length
    difference to every other row (the public code's ``tri_distance`` columns)."""
    gram = row_gram(flat)
    cosine = (1.0 - gram_cosines(gram)) ** 2
    lengths = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    length = np.abs(lengths[:, None] - lengths[None, :])
    n = len(flat)
    manhattan = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            manhattan[i, j] = manhattan[j, i] = float(
                np.abs(np.asarray(flat[i], np.float64) - flat[j]).sum())
    np.fill_diagonal(cosine, 0.0)
    return np.stack([cosine.sum(axis=1), manhattan.sum(axis=1), length.sum(axis=1)], axis=1)


def whitened_scores(sums: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each row's ``t Sigma^+ t^T``, ``Sigma`` the rows' covariance (``np.cov`` of the
    columns, ``ddof = 1``), ``^+`` its pseudo-inverse; zeros for fewer than 2 rows."""
    if len(sums) < 2:
        return np.zeros(len(sums))
    inverse = np.linalg.pinv(np.cov(sums.T))
    return np.asarray(np.einsum("ij,jk,ik->i", sums, inverse, sums))


def lowest(scores: NDArray[np.float64], keep: float) -> NDArray[np.bool_]:
    """A mask of the ``max(1, int(keep x n))`` lowest scores (ties: the earlier row)."""
    count = max(1, int(keep * len(scores)))
    mask = np.zeros(len(scores), dtype=bool)
    mask[np.argsort(scores, kind="stable")[:count]] = True
    return mask


@dataclass(frozen=True)
class Scored:
    """A round's MultiMetrics measurements: the three sums per update, the scores, the mask
    of the updates kept."""

    sums: NDArray[np.float64]
    scores: NDArray[np.float64]
    keep: NDArray[np.bool_]


def score_round(flat: NDArray[np.floating], keep: float) -> Scored:
    """MultiMetrics on a round's flat updates (rows): sums, scores and the kept mask."""
    sums = metric_sums(flat)
    scores = whitened_scores(sums)
    return Scored(sums, scores, lowest(scores, keep))


class MultiMetrics(Guard):
    """MultiMetrics' filter (recorded: ``multi_metrics`` with each client's score and three
    sums)."""

    name = "multi-metrics"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        if not round_.updates:
            return round_
        keep = view.guards.multi_metrics_keep
        scored = score_round(flat_deltas([u.state for u in round_.updates], view.global_state),
                             keep)
        kept = int(scored.keep.sum())
        limit = float(np.max(scored.scores[scored.keep]))
        for upd, ok, score in zip(round_.updates, scored.keep, scored.scores, strict=True):
            if not ok:
                round_.rejected[upd.client_id] = (
                    f"MultiMetrics: score {score:.4g} above the {kept} lowest of "
                    f"{len(round_.updates)} (multi-metrics-keep {keep:g}; the highest kept "
                    f"{limit:.4g})")
        ids = [u.client_id for u in round_.updates]
        round_.record["multi_metrics"] = {
            "score": dict(zip(ids, map(float, scored.scores), strict=True)),
            **{name: dict(zip(ids, map(float, scored.sums[:, c]), strict=True))
               for c, name in enumerate(("cosine", "manhattan", "length"))}}
        round_.updates = [u for u, ok in zip(round_.updates, scored.keep, strict=True) if ok]
        return round_

    def summary(self, guards: Guards) -> str:
        return f"multi-metrics (keep the lowest {guards.multi_metrics_keep:g} of the round)"
