"""``posterior``: FedOwen's posterior selector (issue 43; docs/selection.md).

Empirical-Bayes Thompson sampling on each client's reward history, where the reward is the
client's rank by phi within its round (a booster that already ranks first gains nothing by
boosting) or its phi (``selection-reward``). The between-client variance of the true rewards
is estimated from the data (method of moments, as in a random-effects meta-analysis); where it
is 0, i.e. clients' rewards differ only by noise, every client's posterior is the same point
and the draw is uniform; where clients differ, the draw exploits them in proportion to how
well they are resolved. It exploits only while one-way ANOVA rejects "every client's true
reward is the same" at ``selection-level``; otherwise it draws uniformly. Developed and measured
with the identity cap at 3 (conf/selection-dev.toml): its own default cap.

Everything but :class:`Posterior` is a function of its inputs and an explicit
``numpy.random.Generator``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    Pool,
    Seen,
    Selector,
    SelectorSettings,
)
from fedowen_strategy.selectors.shared import select_uniform
from fedowen_strategy.settings import NO_KEYS, Keys, key, one_of
from fedowen_task import declare

#: What the posterior selector learns from: rank within the round, or phi itself.
REWARDS = ("rank", "phi")
#: A client's rewards so far: ``[count, mean, sum of squared deviations]`` (Welford's).
Book = dict[str, list[float]]


@dataclass(frozen=True)
class PosteriorSettings(SelectorSettings):
    """The posterior selector's keys (defaults: the app's).

    Parameters
    ----------
    reward : {"rank", "phi"}
        What it learns from: each client's rank by phi within its round, or its phi.
    resolve_level : float
        It exploits only while one-way ANOVA rejects "every client's true reward is the
        same" at this level; otherwise it draws uniformly (also the screened selector's level).
    """

    selector: ClassVar[str] = "posterior"
    reward: str = declare.key(
        "rank", "the posterior selector's reward: rank | phi", name="selection-reward")
    resolve_level: float = declare.key(
        0.01, "the posterior selector's ANOVA level", name="selection-level")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings."""
        k = partial(key, keys)
        level = ([] if 0.0 < self.resolve_level <= 1.0 else
                 [f"{k('resolve_level')}={self.resolve_level!r} must lie in (0, 1]"])
        return level + one_of(k("reward"), self.reward, REWARDS)


class Posterior(Selector):
    """Thompson sampling on each client's reward posterior, uniform while no difference
    between clients is resolved; records the round's ANOVA p-value."""

    def __init__(self, settings: PosteriorSettings) -> None:
        self.settings = settings
        self.rewards: Book = {}

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """Uniform while :func:`heterogeneity_p` is at or above the level, else the top ``k``
        of one posterior draw (:func:`thompson_top`)."""
        count, mean, m2 = book_arrays(self.rewards, pool.keys)
        p = heterogeneity_p(count, mean, m2)
        if p >= self.settings.resolve_level:  # no difference resolved: uniform
            return Choice(select_uniform(len(pool.keys), pool.k, rng), "uniform",
                          {"heterogeneity_p": p})
        post_mean, post_var = posterior(count, mean, m2)
        return Choice(thompson_top(post_mean, post_var, np.ones(len(pool.keys), bool), pool.k,
                                   rng), "posterior", {"heterogeneity_p": p})

    def observe(self, seen: Seen) -> None:
        """Add each valued client's reward (its rank within the round, or its phi)."""
        if seen.phi is None:
            return
        phi = np.asarray(seen.phi, dtype=np.float64)
        by_rank = self.settings.reward == "rank" and phi.size
        add_rewards(self.rewards, seen.clients, round_ranks(phi) if by_rank else phi)

    def state(self) -> dict[str, Any]:
        """Each client's reward statistics."""
        return {"rewards": dict(self.rewards)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.rewards = load_book(state)


def add_rewards(book: Book, clients: Sequence[str], rewards: NDArray[np.float64]) -> None:
    """Add one reward per client to ``book`` (Welford's update of count, mean and m2)."""
    for cid, r in zip(clients, rewards, strict=True):
        n, mean, m2 = book.get(cid, [0.0, 0.0, 0.0])
        delta = float(r) - mean
        n, mean = n + 1, mean + delta / (n + 1)
        book[cid] = [n, mean, m2 + delta * (float(r) - mean)]


def book_arrays(book: Book, keys: Sequence[str]
                ) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    """``keys``' counts, mean rewards and sums of squared deviations (0 for the unseen)."""
    stats = np.array([book.get(c, [0.0, 0.0, 0.0]) for c in keys]).reshape(-1, 3)
    return stats[:, 0].astype(np.int64), stats[:, 1], stats[:, 2]


def load_book(state: Mapping[str, Any]) -> Book:
    """The reward book of a checkpoint's state (empty when it holds none)."""
    return {str(c): [float(x) for x in v] for c, v in state.get("rewards", {}).items()}


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
