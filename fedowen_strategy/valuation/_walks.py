"""Permutation walks: the engine behind ``mc-shapley``, ``gtg-shapley``, ``weighted-shap`` and
the walk sampler of ``owen``.

A walk adds players in a given order and records each player's marginal contribution
``nu(prefix + j) - nu(prefix)``. Walks are evaluated together: without truncation all their
prefixes go to the utility in one batch; with truncation, step ``t`` of every live walk goes in
one batch (a "frontier"), so only the rows a truncated walk still needs are ever charged.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, FloatArray, stratified_uniforms

IntArray = np.ndarray


def prefix_masks(orders: IntArray) -> np.ndarray:
    """Boolean masks of shape (K, n, n): ``[k, t]`` holds the first ``t + 1`` players of walk k."""
    n = orders.shape[1]
    position = np.argsort(orders, axis=1)  # position[k, i]: where player i stands in walk k
    return position[:, None, :] <= np.arange(n)[None, :, None]


def run_walks(
    game: CachedGame,
    orders: IntArray,
    v_empty: float,
    v_grand: float,
    tol: float | None = None,
) -> FloatArray:
    """Marginals of each player in each walk, shape (K, n) indexed by player.

    With ``tol`` set, a walk stops once ``|nu(N) - nu(prefix)| < tol`` (checked before every
    step, as in GTG-Shapley); the players after that point get marginal 0. The caller plans
    at most ``game.remaining // (n - 1)`` walks, so the budget cannot run out here.
    """
    n_walks, n = orders.shape
    by_position = np.zeros((n_walks, n))
    if n_walks == 0:
        return by_position
    masks = prefix_masks(orders)
    if tol is None:
        inner = game(masks[:, :-1].reshape(-1, n)).reshape(n_walks, n - 1)
        values = np.column_stack([np.full(n_walks, v_empty), inner, np.full(n_walks, v_grand)])
        by_position = np.diff(values, axis=1)
    else:
        v_prev = np.full(n_walks, v_empty)
        live = np.abs(v_grand - v_prev) >= tol
        for t in range(n):
            idx = np.flatnonzero(live)
            if idx.size == 0:
                break
            v_t = np.full(idx.size, v_grand) if t == n - 1 else game(masks[idx, t])
            by_position[idx, t] = v_t - v_prev[idx]
            v_prev[idx] = v_t
            stop = np.abs(v_grand - v_t) < tol
            if t < n - 1:
                live[idx[stop]] = False
    marginals = np.zeros_like(by_position)
    np.put_along_axis(marginals, orders, by_position, axis=1)
    return marginals


def walk_capacity(game: CachedGame) -> int:
    """Walks that surely fit in the remaining budget (n - 1 new rows each at worst)."""
    return game.remaining // max(game.n_players - 1, 1)


def random_orders(rng: np.random.Generator, n_walks: int, n: int) -> IntArray:
    """Uniformly random permutations, one per row."""
    return np.argsort(rng.random((n_walks, n)), axis=1)


def stratified_orders(
    rng: np.random.Generator, n_walks: int, n: int, strata: int | None, antithetic: bool
) -> IntArray:
    """Walk orders from stratified arrival times (the q-stratified Owen walk).

    Player ``j`` arrives at ``u_j ~ U(0, 1)``; the players before it form a Bernoulli(u_j)
    coalition of the others, so its marginal is an unbiased draw of Owen's ``e_j(q)`` at
    ``q = u_j``, and averaging over walks integrates ``e_j`` over ``q``. Each player's arrival
    times are stratified over [0, 1] across walks; with ``antithetic`` the second half of the
    walks uses ``1 - u`` (the reversed walk: every coalition paired with its complement).
    """
    if antithetic:
        half = stratified_uniforms(rng, n_walks // 2, n, strata)
        arrivals = np.concatenate([half, 1.0 - half])
        if n_walks % 2:
            arrivals = np.concatenate([arrivals, rng.random((1, n))])
    else:
        arrivals = stratified_uniforms(rng, n_walks, n, strata)
    return np.argsort(arrivals, axis=1)


def sample_walks(
    game: CachedGame,
    make_orders: Callable[[int], IntArray],
    v_empty: float,
    v_grand: float,
    tol: float | None = None,
    unit: int = 1,
) -> tuple[list[FloatArray], list[IntArray]]:
    """Run batches of walks until the budget cannot hold another one.

    Each batch is sized to the worst-case cost; evaluations saved by the cache or by
    truncation are re-spent on the next batch. Stops when a batch charged nothing (every
    coalition already known, only possible for tiny games) to avoid looping forever. Batches
    hold a multiple of ``unit`` walks (2 for antithetic pairs, so no walk is left unpaired).
    Returns per-batch marginals and per-batch orders.
    """
    marginals: list[FloatArray] = []
    orders_out: list[IntArray] = []
    while (k := walk_capacity(game) // unit * unit) > 0:
        before = game.n_evals
        orders = make_orders(k)
        marginals.append(run_walks(game, orders, v_empty, v_grand, tol))
        orders_out.append(orders)
        if game.n_evals == before:
            break
    return marginals, orders_out
