"""Owen sampling: ``owen`` (FedOwen's unbiased estimator) and ``owen-paper`` (Algorithm 1).

Both start from Owen's multilinear-extension identity (Owen 1972; Okhrati and Lipani 2021)

    phi_j = integral_0^1 e_j(q) dq,   e_j(q) = E[nu(S + j) - nu(S)],  S ~ Bernoulli(q) over N - j.

``owen`` estimates that integral without bias. Two samplers:

* ``sampler="walk"`` (default): q-stratified Owen walks. Each player gets an arrival time
  ``u_j``; the walk adds players in arrival order, so the players before ``j`` are a
  Bernoulli(u_j) coalition of the others and ``j``'s marginal is a draw of ``e_j(u_j)``.
  Arrival times are stratified over [0, 1] per player across walks (random within strata), and
  ``antithetic`` pairs each walk with its reverse (q with 1 - q, every coalition with its
  complement). One walk costs n - 1 evaluations and gives all n marginals, which telescope to
  ``nu(N) - nu(empty)``: every walk is exactly efficient.
* ``sampler="flip"``: per mask, q is stratified, S ~ Bernoulli(q) over all players, and S with
  its n one-flip neighbours ``S xor e_j`` gives every player the marginal
  ``nu(S + j) - nu(S - j)`` (n + 1 evaluations per mask); ``antithetic`` adds the complement
  mask at 1 - q.

``eta`` (walk sampler only) stops a walk once ``|nu(N) - nu(prefix)| < eta * |nu(N) - nu(empty)|``
and credits 0 to the players left; this is biased (by at most ``eta`` of the gain per walk);
docs/valuation.md measures it.

``owen-antithetic`` is ``owen`` with ``antithetic=True`` under its own name (the walk sampler):
each pair gives player j the average of its marginals to a coalition S of the others and to
their complement, and for a game with at most pairwise interactions that average *is* j's
Shapley value (``a_j + sum_{l in S} b_jl`` and ``a_j + sum_{l not in S} b_jl`` average to
``a_j + sum_l b_jl / 2``). The delta game with neg-loss is nearly quadratic in the updates,
so only its third and higher order terms leave any variance (benchmarks/bench_ranking_battery.py).
Walks are spent in pairs: a budget with room for an odd number of walks leaves the last one's
``n - 1`` evaluations unspent (budget-m = 3 values as budget-m = 2).

No control variate from the linearised game: ``v_lin(S) = sum_{i in S} c_i`` (``c``: the
first-order terms, whose Shapley values are ``c`` itself) shifts every marginal of player i by
the constant ``c_i``, so ``c + owen(v - v_lin)`` equals ``owen(v)`` up to rounding, for any
sampler and seed; the same holds for every estimator that averages marginals or fits an
additive model exactly. A control variate helps only where it varies with the coalition, and the
pairwise (quadratic) part of the game, the largest such part, is what antithetic pairs already
remove exactly. The first-order terms are offered as an estimate of their own (``first-order``).

``owen-paper`` (Algorithm 1 of the paper) lives in ``owen_paper.py``.
"""

from __future__ import annotations

import numpy as np

from fedowen_strategy.valuation._base import (
    FLAT,
    CachedGame,
    FloatArray,
    stratified_uniforms,
    summarise,
)
from fedowen_strategy.valuation._walks import (
    IntArray,
    sample_walks,
    stratified_orders,
    walk_capacity,
)

SAMPLERS = ("walk", "flip")


def owen(
    game: CachedGame,
    rng: np.random.Generator,
    *,
    sampler: str = "walk",
    antithetic: bool = False,
    strata: int | None = None,
    eta: float = 0.0,
) -> FloatArray:
    """Unbiased, stratified, antithetic Owen sampling with sample reuse."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}; got {sampler!r}")
    if strata is not None and (not isinstance(strata, int) or strata < 1):
        raise ValueError(f"strata must be a positive int or None (one per sample); got {strata!r}")
    if eta < 0 or eta >= 1:
        raise ValueError(f"eta must be in [0, 1) (fraction of nu(N) - nu(empty)); got {eta}")
    if sampler == "flip":
        if eta > 0:
            raise ValueError("eta truncation applies to sampler='walk' only; use eta=0.0")
        return _owen_flip(game, rng, antithetic, strata)
    n = game.n_players
    v0, v1 = game.ends()
    gain = abs(v1 - v0)
    tol = eta * gain if eta > 0 and gain >= FLAT else None

    def make(k: int) -> IntArray:
        return stratified_orders(rng, k, n, strata, antithetic)

    if antithetic and walk_capacity(game) < 2:
        raise ValueError(
            f"budget={game.budget} leaves room for no antithetic pair of walks with "
            f"n_players={n}; give at least {2 * n} evaluations or antithetic=False"
        )
    unit = 2 if antithetic else 1
    marginals, _ = sample_walks(game, make, v0, v1, tol, unit=unit)
    if antithetic:  # average each walk with its reverse: the pair is the sampling unit
        marginals = [_pair_means(m) for m in marginals]
    return summarise(marginals, n)


def owen_antithetic(
    game: CachedGame,
    rng: np.random.Generator,
    *,
    strata: int | None = None,
    eta: float = 0.0,
) -> FloatArray:
    """``owen`` with antithetic walk pairs (see the module docstring); unbiased, exactly
    efficient and null-exact like ``owen``, exact on games with at most pairwise interactions.
    One player: its value is ``nu(N) - nu(empty)``, no walk needed."""
    if game.n_players == 1:
        v0, v1 = game.ends()
        return np.array([v1 - v0])
    return owen(game, rng, antithetic=True, strata=strata, eta=eta)


def antithetic_min_budget(n: int) -> int:
    """The ends and one antithetic pair of walks (n - 1 evaluations each); 2 for n = 1."""
    return 2 if n == 1 else 2 * n


def _pair_means(m: FloatArray) -> FloatArray:
    """Rows ``i`` and ``i + k//2`` are antithetic twins; an odd last row stays alone."""
    half = len(m) // 2
    pairs = (m[:half] + m[half : 2 * half]) / 2.0
    return np.concatenate([pairs, m[2 * half :]]) if len(m) % 2 else pairs


def _flip_marginals(game: CachedGame, masks: np.ndarray, players: list[np.ndarray]) -> FloatArray:
    """For each mask S and each player j in ``players[k]``: ``nu(S + j) - nu(S - j)``."""
    n = game.n_players
    rows = [masks]
    for k, js in enumerate(players):
        flips = np.repeat(masks[k : k + 1], len(js), axis=0)
        flips[np.arange(len(js)), js] ^= True
        rows.append(flips)
    values = game(np.concatenate(rows))
    base, offset = values[: len(masks)], len(masks)
    out = np.full((len(masks), n), np.nan)
    for k, js in enumerate(players):
        flipped = values[offset : offset + len(js)]
        offset += len(js)
        sign = np.where(masks[k, js], 1.0, -1.0)  # j in S: nu(S) - nu(S - j)
        out[k, js] = sign * (base[k] - flipped)
    return out


def _owen_flip(
    game: CachedGame, rng: np.random.Generator, antithetic: bool, strata: int | None
) -> FloatArray:
    n = game.n_players
    samples: list[FloatArray] = []
    all_players = np.arange(n)
    unit = (2 if antithetic else 1) * (n + 1)
    while (k := game.remaining // unit) > 0:
        before = game.n_evals
        q = stratified_uniforms(rng, k, 1, strata)
        draws = rng.random((k, n))
        masks = draws < q
        if antithetic:
            masks = np.concatenate([masks, ~masks])
        m = _flip_marginals(game, masks, [all_players] * len(masks))
        samples.append(_pair_means(m) if antithetic else m)
        if game.n_evals == before:
            break
    # Leftover budget: plain masks with a random subset of players, sized pessimistically so
    # which players are included never depends on the cache (no selection bias).
    while game.remaining >= 2:
        before = game.n_evals
        js = rng.permutation(n)[: min(n, game.remaining - 1)]
        mask = rng.random((1, n)) < rng.random()
        samples.append(_flip_marginals(game, mask, [js]))
        if game.n_evals == before:
            break
    return summarise(samples, n)
