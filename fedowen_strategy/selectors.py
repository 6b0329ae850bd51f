"""The field's client selectors and FedOwen's posterior selector: pure functions.

- **Power-of-Choice** (Cho, Wang, Joshi, AISTATS 2022, ``pow-d``): ask ``d > k`` candidates for
  their local loss on the current global model and keep the ``k`` with the highest loss.
  Simplified: the candidates are drawn uniformly (the paper draws them in proportion to their
  data fraction, which the server does not know before it has asked them); each candidate
  evaluates its whole partition (the paper's ``pow-d``, not the mini-batch ``cpow-d``).
- **Oort** (Lai et al., OSDI 2021): a client's statistical utility ``|B_i| sqrt(mean of its
  squared per-sample training losses)``, reported after it trained, plus the staleness bonus
  ``sqrt(0.1 log t / L_i)`` (``L_i`` the round it last took part); ``(1 - eps) k`` clients
  exploited among the explored ones (the top list cut at 95% of the ``(1 - eps) k``-th score,
  sampled in proportion to score), the rest explored among clients never tried; ``eps`` decays
  from 0.9 by 0.98 a round to a floor. Utilities are clipped at their 98th percentile. As in
  FedScale's reference code (SymbioticLab/Oort). Simplified away: the pacer and the system
  utility (every simulated client here is equally fast, so the preferred round duration never
  binds) and the blacklist (off by default there too); unexplored clients are explored
  uniformly (the reference ranks them by speed).
- **Posterior** (FedOwen's, issue 43): empirical-Bayes Thompson sampling on each client's
  reward history, where the reward is the client's rank by phi within its round (a booster
  that already ranks first gains nothing by boosting) or its phi. The between-client variance
  of the true rewards is estimated from the data (method of moments, as in a random-effects
  meta-analysis); where it is 0, i.e. clients' rewards differ only by noise, every client's
  posterior is the same point and the draw is uniform; where clients differ, the draw
  exploits them in proportion to how well they are resolved.
- **Screened** (FedOwen's, issue 43, a second candidate): uniform selection among the clients
  not resolved as harmful, i.e. whose mean phi is not below 0 by a one-sided z test with the
  pooled within-client variance, its level split over the client's looks (a false screen is
  rare over a whole run). It exploits only resolved harm (an update that made the
  server's loss worse, round after round), never a client's lead among helpful ones: where the
  posterior candidates concentrate on the best-valued writers (FEMNIST: below random
  selection), it stays uniform among them; a booster it does not prefer.
- **Identity cap**: a client (or a lasting link group, one identity) selected in more than
  ``cap`` times its uniform share of the rounds so far is not eligible (any selector).

Everything here is a function of its inputs and an explicit ``numpy.random.Generator``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

#: Oort's constants (FedScale's defaults): initial exploration, decay per round, the cut-off
#: on the exploited list (a share of the (1 - eps) k-th score), the clip of the utilities.
OORT_EXPLORATION, OORT_DECAY, OORT_CUT_OFF, OORT_CLIP = 0.9, 0.98, 0.95, 0.98
#: What the posterior selector learns from: rank within the round, or phi itself.
REWARDS = ("rank", "phi")


def keep_highest(losses: NDArray[np.float64], k: int) -> NDArray[np.int64]:
    """Power-of-Choice's cut: positions of the ``k`` highest losses (ties: the earlier
    position; NaN losses count as lowest), sorted."""
    losses = np.asarray(losses, dtype=np.float64)
    if not 1 <= k <= losses.size:
        raise ValueError(f"cannot keep k={k} of {losses.size} candidates; need 1 <= k <= d")
    key = np.where(np.isnan(losses), -np.inf, losses)
    order = np.lexsort((np.arange(key.size), -key))  # highest first, earlier first on ties
    return np.sort(order[:k])


def oort_utility(num_examples: float, squared_loss_sum: float) -> float:
    """Oort's statistical utility ``|B| sqrt(sum(loss^2) / |B|)`` of one client's round."""
    if num_examples <= 0:
        return 0.0
    return float(num_examples * math.sqrt(max(squared_loss_sum, 0.0) / num_examples))


def oort_select(utility: NDArray[np.float64], last_round: NDArray[np.int64], t: int, k: int,
                exploration: float, rng: np.random.Generator) -> NDArray[np.int64]:
    """Oort's pick of ``k`` of ``n`` clients in round ``t`` (FedScale's ``getTopK`` less the
    pacer; module docstring). ``last_round[i]`` is 0 for a client never tried (``utility``
    then ignored), else the round of its latest utility; ``exploration`` is this round's eps."""
    utility = np.asarray(utility, dtype=np.float64)
    last_round = np.asarray(last_round)
    n = utility.size
    if not 1 <= k <= n:
        raise ValueError(f"cannot select k={k} clients out of {n}; need 1 <= k <= {n}")
    explored = np.flatnonzero(last_round > 0)
    unexplored = np.flatnonzero(last_round <= 0)
    picks: list[int] = []
    exploit = min(int(k * (1.0 - exploration)), explored.size - 1)
    if exploit > 0:
        score = oort_scores(utility[explored], last_round[explored], t)
        order = np.argsort(-score, kind="stable")
        cut = score[order[exploit]] * OORT_CUT_OFF
        top = order[score[order] >= cut]
        p = score[top] / score[top].sum() if score[top].sum() > 0 else None
        picks += [int(explored[i]) for i in rng.choice(top, size=exploit, replace=False, p=p)]
    explore = min(unexplored.size, k - len(picks))
    if explore > 0:
        picks += [int(i) for i in rng.choice(unexplored, size=explore, replace=False)]
    if len(picks) < k:  # Oort's fill: uniformly from the rest
        rest = np.setdiff1d(np.arange(n), picks)
        picks += [int(i) for i in rng.choice(rest, size=k - len(picks), replace=False)]
    return np.sort(np.array(picks, dtype=np.int64))


def oort_scores(utility: NDArray[np.float64], last_round: NDArray[np.int64], t: int
                ) -> NDArray[np.float64]:
    """Explored clients' Oort scores: the utility clipped at its 98th percentile and scaled to
    [0, 1] by the explored clients' range, plus ``sqrt(0.1 ln t / L_i)``."""
    values = np.sort(utility)
    clip = values[min(int(values.size * OORT_CLIP), values.size - 1)]
    low = values[0] * 0.999
    span = max(values[-1] - low, 1e-4)
    bonus = np.sqrt(0.1 * math.log(max(t, 1)) / np.maximum(last_round, 1))
    return (np.minimum(utility, clip) - low) / span + bonus


def oort_exploration(t: int, floor: float) -> float:
    """Oort's eps in round ``t`` (the first decay applies in round 1)."""
    return max(OORT_EXPLORATION * OORT_DECAY ** max(t, 1), floor)


def round_ranks(phi: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each value's rank within its round scaled to [0, 1] (lowest 0, highest 1, ties share
    their mean rank; one value: 0.5)."""
    phi = np.asarray(phi, dtype=np.float64)
    if phi.size == 1:
        return np.array([0.5])
    order = np.argsort(phi, kind="stable")
    ranks = np.empty(phi.size)
    ranks[order] = np.arange(phi.size, dtype=np.float64)
    for value in np.unique(phi):  # ties: their mean rank
        tied = phi == value
        ranks[tied] = ranks[tied].mean()
    return ranks / (phi.size - 1)


def heterogeneity_p(count: NDArray[np.int64], mean: NDArray[np.float64],
                    m2: NDArray[np.float64]) -> float:
    """p-value of one-way ANOVA's F test that every client rewarded so far has the same true
    mean reward (1.0 while there are too few rewards to test)."""
    from scipy.stats import f as f_dist

    count = np.asarray(count, dtype=np.float64)
    seen = count > 0
    groups, total = int(seen.sum()), float(count[seen].sum())
    if groups < 2 or total - groups < 1:
        return 1.0
    grand = float((count[seen] * mean[seen]).sum() / total)
    between = float((count[seen] * (mean[seen] - grand) ** 2).sum()) / (groups - 1)
    within = float(m2[seen].sum()) / (total - groups)
    if within <= 0.0:
        return 0.0 if between > 0.0 else 1.0
    return float(f_dist.sf(between / within, groups - 1, total - groups))


def resolved_harmful(count: NDArray[np.int64], mean: NDArray[np.float64],
                     m2: NDArray[np.float64], level: float) -> NDArray[np.bool_]:
    """Which clients' true mean reward is resolved below 0: ``mean + z sqrt(s2 / count) < 0``,
    ``s2`` the within-client variance pooled over every client rewarded (as in
    :func:`posterior`) and ``z`` the one-sided normal quantile at ``level / (count (count +
    1))``: the levels of a client's looks sum to ``level``, so a client whose true mean is 0
    is screened at some round of the run with probability at most ``level`` (a union bound
    over its looks; a screened client is not selected again, so a false screen would last).
    A client rewarded fewer than twice is never resolved."""
    from scipy.stats import norm

    count = np.asarray(count, dtype=np.float64)
    mean = np.asarray(mean, dtype=np.float64)
    seen = count > 0
    df = float((count[seen] - 1).sum())
    if df < 1:
        return np.zeros(count.size, dtype=bool)
    s2 = float(np.asarray(m2, dtype=np.float64)[seen].sum()) / df
    looks = np.maximum(count, 1.0)
    z = norm.isf(level / (looks * (looks + 1.0)))
    bound = mean + z * np.sqrt(max(s2, 0.0) / looks)
    return np.asarray((count >= 2) & (bound < 0.0))


def posterior(count: NDArray[np.int64], mean: NDArray[np.float64], m2: NDArray[np.float64]
              ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per client, the posterior mean and variance of its true reward under a normal
    random-effects model whose grand mean, within-client variance ``s2`` (pooled) and
    between-client variance ``tau2`` (method of moments, floored at 0) are estimated from every
    client's ``count``, ``mean`` and sum of squared deviations ``m2``. A client never rewarded
    gets the prior ``(grand mean, tau2)``. ``tau2 = 0`` gives every client the same point."""
    count = np.asarray(count, dtype=np.float64)
    seen = count > 0
    if seen.sum() < 2:
        return np.zeros(count.size), np.zeros(count.size)
    grand = float((count[seen] * mean[seen]).sum() / count[seen].sum())
    df = float((count[seen] - 1).sum())
    s2 = float(m2[seen].sum() / df) if df > 0 else float(np.var(mean[seen], ddof=1))
    tau2 = max(0.0, float(np.var(mean[seen], ddof=1) - np.mean(s2 / count[seen])))
    post_mean = np.full(count.size, grand)
    post_var = np.full(count.size, tau2)
    if tau2 > 0.0 and s2 > 0.0:
        precision = 1.0 / tau2 + count[seen] / s2
        post_var[seen] = 1.0 / precision
        post_mean[seen] = post_var[seen] * (grand / tau2 + count[seen] * mean[seen] / s2)
    elif tau2 > 0.0:  # no noise at all: the observed means are the truth
        post_mean[seen], post_var[seen] = mean[seen], 0.0
    return post_mean, post_var


def thompson_top(post_mean: NDArray[np.float64], post_var: NDArray[np.float64],
                 eligible: NDArray[np.bool_], k: int, rng: np.random.Generator
                 ) -> NDArray[np.int64]:
    """One posterior draw per client; the ``k`` highest among the eligible (ties broken
    uniformly at random), then uniformly from the ineligible when fewer than ``k`` are."""
    n = post_mean.size
    draw = post_mean + np.sqrt(np.maximum(post_var, 0.0)) * rng.standard_normal(n)
    tie = rng.random(n)
    pool = np.flatnonzero(eligible)
    order = pool[np.lexsort((tie[pool], -draw[pool]))]
    picks = list(order[:k])
    if len(picks) < k:
        rest = np.flatnonzero(~eligible)
        picks += list(rng.choice(rest, size=k - len(picks), replace=False))
    return np.sort(np.array(picks, dtype=np.int64))


def cap_eligible(picks: NDArray[np.int64], group_of: NDArray[np.int64], t: int, k: int,
                 cap: float) -> NDArray[np.bool_]:
    """Which clients may be selected in round ``t``: an identity (a group of clients sharing
    ``group_of``, one client by default) whose selections so far reach ``cap`` times one
    client's uniform share, ``cap (t - 1) k / n`` (at least 1), is not. ``cap`` 0: all."""
    picks = np.asarray(picks)
    if cap <= 0.0:
        return np.ones(picks.size, dtype=bool)
    limit = max(1.0, cap * (t - 1) * k / picks.size)
    _, group = np.unique(group_of, return_inverse=True)
    per_group = np.bincount(group, weights=picks)
    return np.asarray(per_group[group] < limit)
