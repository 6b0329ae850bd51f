"""DELTA's estimates, probabilities, draws and weights as pure functions (Wang, Xu, Wang, Ye;
NeurIPS 2023, arXiv 2205.13925): the paper's form, whose formulas and estimates
:mod:`fedowen_strategy.selectors.delta` states; the public code's score, draw and weights are
:mod:`~fedowen_strategy.selectors.delta_code`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.updates import State, update_keys


def delta_probabilities(zeta: NDArray[np.float64], sigma: NDArray[np.float64],
                        a1: float = 1.0, a2: float = 1.0) -> NDArray[np.float64]:
    """The paper's optimal unbiased probabilities ``sqrt(a1 zeta^2 + a2 sigma^2)``, normalised
    (uniform when every term is 0)."""
    score = delta_scores(np.asarray(zeta), np.asarray(sigma, dtype=np.float64) ** 2, a2 / a1)
    total = score.sum()
    return score / total if total > 0 else np.full(score.size, 1.0 / score.size)


def delta_scores(zeta: NDArray[np.float64], sigma_sq: NDArray[np.float64],
                 sigma_weight: float) -> NDArray[np.float64]:
    """``sqrt(zeta^2 + sigma_weight sigma^2)`` (``a1 = 1``, ``sigma_weight = a2 / a1``)."""
    zeta = np.asarray(zeta, dtype=np.float64)
    return np.sqrt(zeta ** 2 + sigma_weight * np.asarray(sigma_sq, dtype=np.float64))


def fill_missing_with_median(reported: Sequence[float]) -> NDArray[np.float64]:
    """A positive per-client metric as reported (a step scale ``h_i``, num-examples); a
    missing (NaN), infinite or non-positive one is the round's median of the valid ones (1
    when there is none)."""
    h = np.asarray(reported, dtype=np.float64)
    ok = np.isfinite(h) & (h > 0)
    fill = float(np.median(h[ok])) if ok.any() else 1.0
    return np.where(ok, h, fill)


def gradient_diversity(states: Sequence[State], global_state: State,
                       scales: NDArray[np.float64]) -> NDArray[np.float64]:
    """``zeta_i = ||g_i - mean_j g_j||`` with ``g_i = -(states[i] - global) / scales[i]`` over
    the update keys, array by array (no flat copy of the updates is held)."""
    return gradient_spread(states, global_state, scales)[1]


def gradient_spread(states: Sequence[State], global_state: State, scales: NDArray[np.float64]
                    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(||g_i||, zeta_i)`` of :func:`gradient_diversity`'s ``g_i``, in one pass."""
    norms, squares = np.zeros(len(states)), np.zeros(len(states))
    for name in update_keys(global_state):
        ref = np.asarray(global_state[name], np.float64)
        g = np.stack([(ref - np.asarray(s[name], np.float64)).ravel() / h
                      for s, h in zip(states, scales, strict=True)])
        norms += (g ** 2).sum(axis=1)
        squares += ((g - g.mean(axis=0)) ** 2).sum(axis=1)
    return np.sqrt(norms), np.sqrt(squares)


def rescale_masses(old: NDArray[np.float64], scores: NDArray[np.float64]
                   ) -> NDArray[np.float64]:
    """The participants' new masses: ``scores`` scaled to the total of their ``old`` masses
    (the old masses when every score is 0)."""
    old, scores = np.asarray(old, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    total = scores.sum()
    return scores / total * old.sum() if total > 0 else old.copy()


def draw_probabilities(masses: NDArray[np.float64], floor: float) -> NDArray[np.float64]:
    """``q = (1 - floor) masses / sum masses + floor / N`` (uniform when the masses sum
    to 0)."""
    masses = np.asarray(masses, dtype=np.float64)
    n = masses.size
    total = masses.sum()
    share = masses / total if total > 0 else np.full(n, 1.0 / n)
    return (1.0 - floor) * share + floor / n


def draw_with_replacement(q: NDArray[np.float64], k: int, rng: np.random.Generator
                          ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``k`` i.i.d. draws from ``q``: the distinct indices drawn (sorted) and how often each
    was."""
    if not 1 <= k:
        raise ValueError(f"cannot draw k={k} clients; need k >= 1")
    draws = rng.choice(q.size, size=k, replace=True, p=q)
    picked, counts = np.unique(draws, return_counts=True)
    return picked.astype(np.int64), counts.astype(np.int64)


def importance_weights(lam: NDArray[np.float64], counts: NDArray[np.float64],
                       q: NDArray[np.float64], k: int) -> NDArray[np.float64]:
    """The unbiased estimator's weights ``c_i lambda_i / (k q_i)``: ``sum_i w_i delta_i``
    over the distinct clients drawn, each drawn ``c_i`` of ``k`` times with probability
    ``q_i``, has expectation ``sum_j lambda_j delta_j`` over the whole pool."""
    return (np.asarray(counts, dtype=np.float64) * np.asarray(lam, dtype=np.float64)
            / (k * np.asarray(q, dtype=np.float64)))
