"""Regression estimators: ``kernel-shap``, ``leverage-shap`` and ``kadd-shap``.

All three fit a surrogate game to sampled coalitions by least squares under the Shapley kernel
``mu(S) = (n - 1) / (C(n, |S|) |S| (n - |S|))``, with ``nu(empty)`` fixed and the surrogate's
``nu(N)`` forced to the true one, and return the surrogate's Shapley values:

* ``kernel-shap`` (Lundberg and Lee 2017; Covert and Lee 2021): an additive surrogate, i.e.
  the constrained weighted least-squares characterisation of the Shapley value. Sizes are drawn
  from the kernel itself (``proposal="kernel"``), with paired sampling (each coalition with its
  complement) and the border trick (sizes whose expected draws exceed their count enumerated).
* ``leverage-shap`` (Musco and Witter 2025): the same regression, sizes drawn uniformly (the
  rows' leverage scores are equal within a size and, weighted, equal across sizes), with
  importance weights ``mu(s) / q(s)``.
* ``kadd-shap`` (Pelegrina, Duarte and Grabisch 2023): a 2-additive surrogate
  ``nu(S) ~ nu(empty) + sum_{i in S} a_i + sum_{i<j in S} b_ij`` (the same space as their
  Shapley-interaction basis, written in the Moebius basis), whose Shapley values are
  ``a_i + sum_j b_ij / 2``. Exact for every game with at most pairwise interactions. Below
  ``n + n(n-1)/2`` distinct coalitions the fit is underdetermined; only then ``ridge`` (relative
  to the total kernel weight) shrinks the pair terms, so the linear part stays data-driven.

Every estimate is exactly efficient (the constraint). With a budget of ``2^n`` every size is
enumerated and all three return the exact Shapley values (the weighted projection's residual is
orthogonal to every additive game, so its Shapley value is 0). None is unbiased at a finite
budget (a ratio of random quantities); null players and symmetric players are treated alike
only in expectation.
"""

from __future__ import annotations

from math import comb

import numpy as np

from fedowen_strategy.valuation._base import BoolArray, CachedGame, FloatArray
from fedowen_strategy.valuation._sampling import (
    border_plan,
    draw_samples,
    enumerate_exact,
    shapley_kernel,
)

PROPOSALS = ("kernel", "leverage")


def _pair_index(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, 1)


def _features(masks: BoolArray, order: int) -> FloatArray:
    x = masks.astype(np.float64)
    if order == 1:
        return x
    i, j = _pair_index(masks.shape[1])
    return np.concatenate([x, x[:, i] * x[:, j]], axis=1)


def _row_weights(
    masks: BoolArray, n_exact: int, mu: FloatArray, proposal: dict[int, float]
) -> FloatArray:
    """Kernel weight per row: exact rows ``mu(s)/C(n,s)``; draws ``mu(s) / (q(s) K)``."""
    sizes = masks.sum(axis=1)
    n = masks.shape[1]
    w = np.empty(len(masks))
    exact_sizes = sizes[:n_exact]
    w[:n_exact] = mu[exact_sizes] / np.array([comb(n, int(s)) for s in exact_sizes])
    drawn = sizes[n_exact:]
    if len(drawn):
        q = np.array([proposal[int(s)] for s in drawn])
        w[n_exact:] = mu[drawn] / (q * len(drawn))
    return w


def constrained_wls(
    x: FloatArray, y: FloatArray, w: FloatArray, total: float, ridge: FloatArray
) -> FloatArray:
    """``argmin sum w (y - x b)^2 + sum ridge b^2`` subject to ``sum b = total`` (KKT system).

    Solved with ``lstsq`` so a singular system (fewer rows than features) gets the
    minimum-norm solution instead of an error.
    """
    p = x.shape[1]
    a = x.T @ (w[:, None] * x) + np.diag(ridge)
    kkt = np.zeros((p + 1, p + 1))
    kkt[:p, :p] = a
    kkt[:p, p] = kkt[p, :p] = 1.0
    rhs = np.concatenate([x.T @ (w * y), [total]])
    return np.linalg.lstsq(kkt, rhs, rcond=None)[0][:p]


def _regression(
    game: CachedGame,
    rng: np.random.Generator,
    proposal: str,
    paired: bool,
    order: int,
    ridge: float,
) -> FloatArray:
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}; got {proposal!r}")
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0; got {ridge}")
    n = game.n_players
    v0, v1 = game.ends()
    mu = shapley_kernel(n)
    weights = mu.copy() if proposal == "kernel" else (mu > 0).astype(np.float64)
    plan = border_plan(n, game.budget, weights)
    ex_masks, ex_values = enumerate_exact(game, plan)
    dr_masks, dr_values = draw_samples(game, rng, plan, paired)
    masks = np.concatenate([ex_masks, dr_masks])
    y = np.concatenate([ex_values, dr_values]) - v0
    w = _row_weights(masks, len(ex_masks), mu, dict(zip(plan.sampled, plan.proposal, strict=True)))
    x = _features(masks, order)
    penalty = np.zeros(x.shape[1])
    if len(np.unique(masks, axis=0)) < x.shape[1]:  # underdetermined: shrink the pair terms
        penalty[n:] = ridge * w.sum()
    beta = constrained_wls(x, y, w, v1 - v0, penalty)
    values = beta[:n].copy()
    if order == 2:
        i, j = _pair_index(n)
        np.add.at(values, i, beta[n:] / 2.0)
        np.add.at(values, j, beta[n:] / 2.0)
    return values


def kernel_shap(
    game: CachedGame, rng: np.random.Generator, *, paired: bool = True, proposal: str = "kernel"
) -> FloatArray:
    """KernelSHAP: constrained Shapley-kernel regression, paired sampling, border trick."""
    return _regression(game, rng, proposal, paired, order=1, ridge=0.0)


def leverage_shap(
    game: CachedGame, rng: np.random.Generator, *, paired: bool = True
) -> FloatArray:
    """Leverage SHAP: KernelSHAP's regression with sizes drawn uniformly (leverage scores)."""
    return _regression(game, rng, "leverage", paired, order=1, ridge=0.0)


def kadd_shap(
    game: CachedGame,
    rng: np.random.Generator,
    *,
    paired: bool = False,
    proposal: str = "kernel",
    ridge: float = 1e-6,
) -> FloatArray:
    """kADD-SHAP with k = 2: Shapley values of a fitted 2-additive game."""
    return _regression(game, rng, proposal, paired, order=2, ridge=ridge)
