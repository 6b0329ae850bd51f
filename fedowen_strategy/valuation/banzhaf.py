"""``banzhaf``: maximum-sample-reuse Monte Carlo for the Banzhaf value.

Wang and Jia (2023), "Data Banzhaf: A robust data valuation framework for machine learning".
Subsets ``S`` are drawn uniformly (each player in with probability 1/2) and every draw is used
for every player: ``beta_i = mean(nu(S) : i in S) - mean(nu(S) : i not in S)``. One evaluation
per draw. The Banzhaf value is a semivalue (symmetry, null player) but not efficient; its
values are in raw units and do not sum to ``nu(N) - nu(empty)``. The subsets are drawn with
the budget left after the registry's ``nu(empty)`` and ``nu(N)`` (a draw of either is free).
"""

from __future__ import annotations

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, FloatArray


def banzhaf(game: CachedGame, rng: np.random.Generator) -> FloatArray:
    """MSR Banzhaf estimate, drawing subsets until the budget is spent."""
    n = game.n_players
    masks_all: list[np.ndarray] = []
    values_all: list[np.ndarray] = []
    while game.remaining > 0:
        before = game.n_evals
        masks = rng.random((game.remaining, n)) < 0.5  # repeats are free: cache
        values_all.append(game(masks))
        masks_all.append(masks)
        if game.n_evals == before:
            break
    masks = np.concatenate(masks_all)
    values = np.concatenate(values_all)
    inside = masks.sum(axis=0)
    outside = len(masks) - inside
    sum_in = values @ masks
    sum_out = values.sum() - sum_in
    mean_in = sum_in / np.maximum(inside, 1)
    mean_out = sum_out / np.maximum(outside, 1)
    ok = (inside > 0) & (outside > 0)
    return np.where(ok, mean_in - mean_out, 0.0)
