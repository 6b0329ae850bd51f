"""``svarm``: Stratified SVARM (Kolpaczki, Bengs, Muschalik and Huellermeier, AAAI 2024,
"Approximating the Shapley value without marginal contributions").

The Shapley value written over coalition sizes, without marginal contributions:

    phi_i = (nu(N) - nu(empty) + sum_{s=1}^{n-1} [m+_{i,s} - m-_{i,s}]) / n,

with ``m+_{i,s}`` (``m-_{i,s}``) the mean of ``nu`` over the size-s coalitions that contain
(do not contain) ``i``. Every evaluated coalition ``A`` of size ``s`` is a sample of ``m+`` for
each of its members and of ``m-`` for everyone else: one evaluation updates n strata.

* Sizes 1 and n - 1 are enumerated when the budget allows (``2n`` evaluations), as in the
  paper, and the border trick (``_sampling``) enumerates any further size whose expected
  number of draws exceeds its number of coalitions.
* **Warm-up** (when it fits in the budget): for every sampled size ``s``, random permutations
  cut into consecutive blocks of size ``s`` and of size ``n - s`` (the last block filled up with
  random other players), each block with its complement, so every stratum holds at least one
  sample. Each block is a uniform random coalition of its size, so every stratum mean stays
  unbiased.
* Then sizes are drawn from ``proposal`` (``"uniform"`` over the sampled sizes, or the Shapley
  ``"kernel"``), coalitions uniformly within a size, until the budget is spent.

Axioms: unbiased when the warm-up fitted (every stratum sampled; each stratum mean is a mean of
uniform draws from its stratum); below that budget a missing difference ``m+ - m-`` is
replaced by the mean of the player's observed ones (biased). Not efficient per estimate (each
player's strata are estimated separately); symmetry and the null player hold in expectation.
"""

from __future__ import annotations

import numpy as np

from fedowen_strategy.valuation._base import BoolArray, CachedGame, FloatArray
from fedowen_strategy.valuation._sampling import (
    SizePlan,
    border_plan,
    draw_samples,
    enumerate_exact,
    shapley_kernel,
)

PROPOSALS = ("uniform", "kernel")
_BIG = 1e9  # proposal weight that makes the border trick enumerate sizes 1 and n - 1 first


def cover_blocks(rng: np.random.Generator, n: int, s: int) -> BoolArray:
    """Blocks of size ``s`` of a random permutation covering every player at least once."""
    perm = rng.permutation(n)
    n_blocks = -(-n // s)
    masks = np.zeros((n_blocks, n), dtype=bool)
    for b in range(n_blocks):
        block = perm[b * s : (b + 1) * s]
        if len(block) < s:  # fill the last block with random players from the earlier ones
            block = np.concatenate([block, rng.choice(perm[: b * s], s - len(block), False)])
        masks[b, block] = True
    return masks


def warmup_masks(rng: np.random.Generator, n: int, sizes: tuple[int, ...]) -> BoolArray:
    """Blocks of size s and n - s with their complements, for every sampled size s <= n/2."""
    parts = [np.zeros((0, n), dtype=bool)]
    for s in sorted({min(s, n - s) for s in sizes}):
        for size in dict.fromkeys((s, n - s)):
            blocks = cover_blocks(rng, n, size)
            parts += [blocks, ~blocks]
    return np.concatenate(parts)


class _Strata:
    """Sums and counts of ``nu`` per (player, size), inside (+) and outside (-) the coalition."""

    def __init__(self, n: int) -> None:
        self.plus = np.zeros((n, n + 1))
        self.minus = np.zeros((n, n + 1))
        self.n_plus = np.zeros((n, n + 1), dtype=np.int64)
        self.n_minus = np.zeros((n, n + 1), dtype=np.int64)

    def add(self, masks: BoolArray, values: FloatArray) -> None:
        sizes = masks.sum(axis=1)
        for s in np.unique(sizes):
            m, v = masks[sizes == s], values[sizes == s]
            self.plus[:, s] += m.T @ v
            self.minus[:, s] += (~m).T @ v
            self.n_plus[:, s] += m.sum(axis=0)
            self.n_minus[:, s] += (~m).sum(axis=0)

    def values(self, gain: float) -> FloatArray:
        n = self.plus.shape[0]
        inner = slice(1, n)
        seen = (self.n_plus[:, inner] > 0) & (self.n_minus[:, inner] > 0)
        diff = np.where(
            seen,
            self.plus[:, inner] / np.maximum(self.n_plus[:, inner], 1)
            - self.minus[:, inner] / np.maximum(self.n_minus[:, inner], 1),
            0.0,
        )
        n_seen = seen.sum(axis=1)
        fill = diff.sum(axis=1) / np.maximum(n_seen, 1)  # a missing level: the player's mean
        total = diff.sum(axis=1) + (n - 1 - n_seen) * fill
        return (gain + total) / n


def _plan(n: int, budget: int, proposal: str) -> SizePlan:
    weights = shapley_kernel(n) if proposal == "kernel" else np.ones(n + 1)
    weights[0] = weights[n] = 0.0
    if n >= 3:
        weights[1] = weights[n - 1] = _BIG
    return border_plan(n, budget, weights)


def svarm(game: CachedGame, rng: np.random.Generator, *,
          proposal: str = "uniform") -> FloatArray:
    """Stratified SVARM with exact sizes 1 and n - 1, a covering warm-up and random draws."""
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}; got {proposal!r}")
    n = game.n_players
    v0, v1 = game.ends()
    strata = _Strata(n)
    strata.add(np.array([np.zeros(n, bool), np.ones(n, bool)]), np.array([v0, v1]))
    plan = _plan(n, game.budget, proposal)
    if set(plan.exact) >= {1, n - 1} or n < 3:
        strata.add(*enumerate_exact(game, plan))
        warm = warmup_masks(rng, n, plan.sampled)
        if plan.sampled and game.cost(warm) <= game.remaining:
            strata.add(warm, game(warm))
    else:  # too small a budget for the exact sizes: sample every inner size
        sizes = tuple(range(1, n))
        plan = SizePlan((), sizes, np.full(n - 1, 1.0 / (n - 1)), game.remaining)
    strata.add(*draw_samples(game, rng, plan, paired=False))
    return strata.values(v1 - v0)
