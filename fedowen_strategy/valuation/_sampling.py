"""Coalition-size sampling shared by the regression estimators and SVARM.

* **Shapley kernel by size**: ``mu(s) = (n - 1) / (s (n - s))`` for ``1 <= s <= n - 1``; a single
  coalition of size s carries ``mu(s) / C(n, s)`` (Lundberg and Lee 2017).
* **Border trick** (Fumagalli et al. 2023; shapiq's ``CoalitionSampler``): a size whose expected
  number of draws under the proposal is at least the number of coalitions of that size is
  enumerated completely instead of sampled, repeatedly, from the outside sizes inwards. With a
  budget of ``2^n`` every size is enumerated and the estimators become exact.
* **Paired sampling** (Covert and Lee 2021): each drawn coalition comes with its complement.

Draws are with replacement; a coalition drawn twice is served by the game's cache for free and
counts twice in the estimate (its multiplicity), so the importance weights stay correct.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from fedowen_strategy.valuation._base import BoolArray, CachedGame, FloatArray


def shapley_kernel(n: int) -> FloatArray:
    """``mu(s)`` for ``s = 0..n`` (0 at the ends), normalised to sum 1 over ``1..n-1``."""
    mu = np.zeros(n + 1)
    if n >= 2:
        s = np.arange(1, n)
        mu[1:n] = 1.0 / (s * (n - s))
        mu /= mu.sum()
    return mu


def coalitions_of_size(n: int, s: int) -> BoolArray:
    """All ``C(n, s)`` coalitions of size ``s`` as a boolean ``(C(n, s), n)`` array."""
    combos = list(itertools.combinations(range(n), s))
    masks = np.zeros((len(combos), n), dtype=bool)
    for row, combo in enumerate(combos):
        masks[row, list(combo)] = True
    return masks


def random_of_sizes(rng: np.random.Generator, n: int, sizes: np.ndarray) -> BoolArray:
    """One uniformly random coalition of each size in ``sizes``, as a ``(len(sizes), n)`` mask."""
    ranks = np.argsort(np.argsort(rng.random((len(sizes), n)), axis=1), axis=1)
    return ranks < np.asarray(sizes)[:, None]


@dataclass(frozen=True)
class SizePlan:
    """Which sizes are enumerated, which sampled and with what probabilities."""

    exact: tuple[int, ...]
    sampled: tuple[int, ...]
    proposal: FloatArray  # probabilities over ``sampled``
    sample_budget: int  # evaluations left for sampling after the ends and exact sizes


def border_plan(n: int, budget: int, weights: FloatArray) -> SizePlan:
    """Border trick over sizes ``1..n-1`` with proposal ``weights`` (indexed by size).

    The empty and grand coalitions are always evaluated (2 of the budget).
    """
    left = budget - 2
    sampled = [s for s in range(1, n) if weights[s] > 0]
    exact: list[int] = []
    while sampled:
        p = weights[sampled] / weights[sampled].sum()
        move = [s for s, ps in zip(sampled, p, strict=True) if left * ps >= math.comb(n, s)]
        if not move:
            break
        exact += move
        left -= sum(math.comb(n, s) for s in move)
        sampled = [s for s in sampled if s not in move]
    p = weights[sampled] / weights[sampled].sum() if sampled else np.zeros(0)
    return SizePlan(tuple(sorted(exact)), tuple(sampled), p, max(left, 0))


def enumerate_exact(game: CachedGame, plan: SizePlan) -> tuple[BoolArray, FloatArray]:
    """Evaluate every coalition of the plan's exact sizes in one batch."""
    n = game.n_players
    if not plan.exact:
        return np.zeros((0, n), dtype=bool), np.zeros(0)
    masks = np.concatenate([coalitions_of_size(n, s) for s in plan.exact])
    return masks, game(masks)


def draw_samples(
    game: CachedGame, rng: np.random.Generator, plan: SizePlan, paired: bool
) -> tuple[BoolArray, FloatArray]:
    """Draw coalitions from the plan's sampled sizes until the budget is spent.

    Returns every draw (duplicates included, in draw order) and its value. Batches are sized so
    their new rows always fit; the loop stops when a batch charges nothing (all rows cached).
    """
    n = game.n_players
    masks_all: list[BoolArray] = [np.zeros((0, n), dtype=bool)]
    values_all: list[FloatArray] = [np.zeros(0)]
    unit = 2 if paired else 1
    sizes = np.array(plan.sampled)
    while plan.sampled and (k := game.remaining // unit) > 0:
        before = game.n_evals
        masks = random_of_sizes(rng, n, rng.choice(sizes, size=k, p=plan.proposal))
        if paired:
            masks = np.stack([masks, ~masks], axis=1).reshape(-1, n)
        values_all.append(game(masks))
        masks_all.append(masks)
        if game.n_evals == before:
            break
    return np.concatenate(masks_all), np.concatenate(values_all)
