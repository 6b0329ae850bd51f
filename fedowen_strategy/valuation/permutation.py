"""Permutation-based baselines: ``mc-shapley``, ``gtg-shapley``, ``weighted-shap`` and ``loo``.

* ``mc-shapley``: Castro, Gomez and Tejada (2009), "Polynomial calculation of the Shapley value
  based on sampling". Uniform permutations; each player's value is the mean of its marginals.
  ``antithetic=True`` pairs every permutation with its reverse.
* ``gtg-shapley``: Liu et al. (2022), "GTG-Shapley: Efficient and accurate participant
  contribution evaluation in federated learning". Guided sampling (each player leads in turn,
  the rest in random order) and within-round truncation: once ``|nu(N) - nu(prefix)| < eps``
  the remaining players of the walk get 0. The paper's between-round truncation (skip a round
  whose model barely changed) is not implemented: a round is always valued.
* ``weighted-shap``: Kwon and Zou (2022), Beta Shapley / WeightedSHAP. A semivalue weighting the
  marginal at position ``j`` (coalition size ``j - 1``) by
  ``w_j = n * C(n-1, j-1) * B(j - 1 + beta, n - j + alpha) / B(alpha, beta)``, the weights of
  the Beta(alpha, beta) semivalue (mean weight 1; ``alpha = beta = 1`` is the Shapley value;
  large ``alpha`` stresses small coalitions, Beta Shapley's recommended ``(16, 1)``).
* ``loo``: leave-one-out, ``nu(N) - nu(N \\ {i})``; n + 1 evaluations (n + 2 with nu(empty)).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, FloatArray, summarise
from fedowen_strategy.valuation._walks import IntArray, random_orders, sample_walks


def _antithetic_orders(rng: np.random.Generator, k: int, n: int) -> IntArray:
    half = random_orders(rng, k // 2, n)
    parts = [half, half[:, ::-1]]
    if k % 2:
        parts.append(random_orders(rng, 1, n))
    return np.concatenate(parts)


def mc_shapley(game: CachedGame, rng: np.random.Generator, *,
               antithetic: bool = False) -> FloatArray:
    """Permutation sampling (Castro et al. 2009)."""
    n = game.n_players
    v0, v1 = game.ends()

    def make(k: int) -> IntArray:
        return _antithetic_orders(rng, k, n) if antithetic else random_orders(rng, k, n)

    marginals, _ = sample_walks(game, make, v0, v1, unit=2 if antithetic else 1)
    return summarise(marginals, n)


def gtg_shapley(
    game: CachedGame,
    rng: np.random.Generator,
    *,
    eps: float = 1e-3,
) -> FloatArray:
    """Guided truncation gradient Shapley (Liu et al. 2022), stopped at the budget."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0 (absolute, in the utility's units); got {eps}")
    n = game.n_players
    v0, v1 = game.ends()
    leaders: Iterator[int] = iter(())  # cycles through random player orders so each leads in turn

    def make(k: int) -> IntArray:
        nonlocal leaders
        orders = random_orders(rng, k, n)
        for row in orders:
            lead = next(leaders, None)
            if lead is None:
                leaders = iter(rng.permutation(n).tolist())
                lead = next(leaders)
            pos = int(np.flatnonzero(row == lead)[0])
            row[[0, pos]] = row[[pos, 0]]
        return orders

    marginals, _ = sample_walks(game, make, v0, v1, tol=eps if eps > 0 else None)
    return summarise(marginals, n)


def beta_weights(n: int, alpha: float, beta: float) -> FloatArray:
    """Position weights ``w_1..w_n`` of the Beta(alpha, beta) semivalue (mean 1)."""
    j = np.arange(1, n + 1)
    log_b = math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta)
    logs = [
        math.log(n)
        + math.lgamma(n) - math.lgamma(int(jj)) - math.lgamma(n - int(jj) + 1)
        + math.lgamma(jj - 1 + beta) + math.lgamma(n - jj + alpha)
        - math.lgamma(n - 1 + alpha + beta)
        - log_b
        for jj in j
    ]
    return np.exp(np.array(logs))


def weighted_shap(
    game: CachedGame, rng: np.random.Generator, *, alpha: float = 16.0, beta: float = 1.0
) -> FloatArray:
    """Beta(alpha, beta)-weighted semivalue from position-wise permutation marginals."""
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"alpha and beta must be > 0; got alpha={alpha}, beta={beta}")
    n = game.n_players
    v0, v1 = game.ends()
    weights = beta_weights(n, alpha, beta)
    marginals, orders = sample_walks(game, lambda k: random_orders(rng, k, n), v0, v1)
    weighted = []
    for m, o in zip(marginals, orders, strict=True):
        w = np.empty_like(m)
        np.put_along_axis(w, o, np.broadcast_to(weights, o.shape), axis=1)
        weighted.append(m * w)
    return summarise(weighted, n)


def loo(game: CachedGame, rng: np.random.Generator) -> FloatArray:
    """Leave-one-out values ``nu(N) - nu(N without i)``; deterministic, n + 1 evaluations
    (n + 2 with the registry's nu(empty))."""
    n = game.n_players
    masks = np.ones((n + 1, n), dtype=bool)
    masks[np.arange(1, n + 1), np.arange(n)] = False
    v = game(masks)
    return v[0] - v[1:]
