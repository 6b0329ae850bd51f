"""The sequential ``owen-paper`` as it was before the lockstep rewrite (one walk at a time, one
row per utility call with truncation): the reference the lockstep implementation must equal
value for value (tests/test_owen_paper_lockstep.py). Test code only."""

from __future__ import annotations

import numpy as np

from fedowen_strategy.valuation._base import FLAT, CachedGame, FloatArray


def owen_paper_sequential(
    game: CachedGame,
    rng: np.random.Generator,
    *,
    levels: int = 2,
    eta: float = 0.01,
) -> FloatArray:
    """Algorithm 1 of the FedOwen paper (Owen sampling with eta-truncation), literally."""
    if not isinstance(levels, int) or levels < 1:
        raise ValueError(f"levels (Q) must be a positive int; got {levels!r}")
    if eta < 0:
        raise ValueError(f"eta must be >= 0 (normalised units); got {eta}")
    n = game.n_players
    v0, v1 = game.ends()
    gain = v1 - v0
    normalise = abs(gain) >= FLAT
    scale = gain if normalise else 1.0  # guard: only shift when the gain is ~0
    truncate = normalise and eta > 0
    sums = np.zeros((levels, n))
    walks = np.zeros(levels, dtype=np.int64)
    level = 0
    idle = 0  # consecutive walks that charged nothing (all rows cached: tiny games)
    while game.remaining > 0 and idle < 10 * levels + 10:
        before = game.n_evals
        q = (level + 1) / levels
        chosen = np.flatnonzero(rng.random(n) < q)
        order = rng.permutation(chosen)
        credits, _, complete = _paper_walk(game, order, v0, scale, truncate, eta)
        sums[level] += credits
        walks[level] += 1
        if not complete:
            break
        idle = idle + 1 if game.n_evals == before else 0
        level = (level + 1) % levels
    per_level = sums / np.maximum(walks, 1)[:, None]
    used = walks > 0
    return per_level[used].mean(axis=0) * scale if used.any() else np.zeros(n)


def _paper_walk(
    game: CachedGame,
    order: np.ndarray,
    v0: float,
    scale: float,
    truncate: bool,
    eta: float,
) -> tuple[FloatArray, bool, bool]:
    """One walk of Algorithm 1 in normalised units: (credits, truncated?, finished in budget?)."""
    n = game.n_players
    credits = np.zeros(n)
    masks = np.zeros((len(order), n), dtype=bool)
    for t, j in enumerate(order):
        masks[t:, j] = True
    if not truncate:  # nothing depends on the values: one batch, cut at the budget
        fit = _rows_that_fit(game, masks)
        nu = (game(masks[:fit]) - v0) / scale
        credits[order[:fit]] = np.diff(np.concatenate([[0.0], nu]))
        return credits, False, fit == len(order)
    v_prev = 0.0
    for t, j in enumerate(order):
        if game.cost(masks[t : t + 1]) > game.remaining:
            return credits, False, False
        nu_c = (float(game(masks[t : t + 1])[0]) - v0) / scale
        credits[j] = nu_c - v_prev
        if 1.0 - nu_c < eta:  # optimistic remainder Delta_left = 1 - nu(C) below eta
            return credits, True, True
        v_prev = nu_c
    return credits, False, True


def _rows_that_fit(game: CachedGame, masks: np.ndarray) -> int:
    """Largest prefix of ``masks`` whose new rows fit in the remaining budget."""
    lo, hi = 0, len(masks)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if game.cost(masks[:mid]) <= game.remaining:
            lo = mid
        else:
            hi = mid - 1
    return lo
