"""``first-order-refined``: cheap where the ranking is settled, walks where it is not (issue 71).

Three gradients value every player; coalition evaluations go only to the players whose order
those gradients leave open. The rule, for a utility with first-order terms ``c(t)``
(:mod:`fedowen_strategy.valuation._base`: ``c_i(t) = dF/dx_i (t, ..., t)`` of the game's smooth
extension ``F``):

1. **Cheap values** (no coalition evaluated): ``c(0)``, ``c(1/2)``, ``c(1)``, and Simpson's rule
   on the diagonal, ``s_i = (c_i(0) + 4 c_i(1/2) + c_i(1)) / 6`` (``first-order``'s value is the
   midpoint rule, ``c_i(1/2)``). Both are exact when ``F`` is quadratic.
2. **Bands**: ``h_i = band * |c_i(0) - 2 c_i(1/2) + c_i(1)| / 6``, ``band`` times the gap between
   Simpson's and the midpoint rule: a second difference of ``c_i`` along the diagonal, i.e.
   how far ``F`` is from quadratic in player i's direction, the part both rules get wrong. On the
   recorded app games (tests/data/games, dev half) the players' errors ``|phi_i - c_i(1/2)|``
   follow ``|c_i(0) - 2 c_i(1/2) + c_i(1)|`` with a Spearman correlation of 0.6-0.99 in the
   games where first-order ranks worst.
3. **Unsettled**: player i is unsettled when some other player j has ``|s_i - s_j| < h_i + h_j``
   (their bands overlap, so the cheap values do not settle their order). Settled players keep
   ``s_i``. Unsettled players are refined widest band first; ties in a random order, so that
   symmetric players are treated alike in expectation.
4. **Refinement**: antithetic pairs of Owen walks (arrival times ``u`` and ``1 - u``, stratified
   per player across pairs) that evaluate, for each refined player j, only the coalition before
   j and the one with j, in both walks of the pair. A refined player's value is the mean of its
   pair-averaged marginals: an unbiased estimate of its Shapley value, exact for any game with
   at most pairwise interactions (as ``owen-antithetic``'s). A walk needs at most
   ``min(2k, n - 1)`` new coalitions for k refined players (the ends are the record's), a pair
   at most twice that. Every refined player gets ``pairs`` pairs (one pair of walks is noisier
   than Simpson's error on the recorded games, so a thinner spread is worse than none): all
   unsettled players when ``pairs`` pairs for all of them fit the budget, else the first ``k``
   of them (in priority order) for whom they fit; none when not even one player's fit.

Budget: ``n_evals`` counts every coalition evaluated (the ends included) and stays within the
budget; the three gradients are counted apart (``n_gradients = 3``). Where few players are
unsettled it spends far less than the budget: the saving is the point.

Axioms: a null player gets exactly 0 (its terms are 0, so its band is 0 and its cheap value 0;
refined, its marginals are 0); exact on additive and on pairwise (quadratic) games; symmetric in
expectation; not efficient; biased for the settled players by ``s``'s error. Hyperparameters
``band = 2.0, pairs = 2`` were chosen on the development half of the ranking battery
(benchmarks/bench_ranking_battery.py; docs/benchmarks.md, section 11).
"""

from __future__ import annotations

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, FloatArray, stratified_uniforms

IntArray = np.ndarray


def first_order_refined(game: CachedGame, rng: np.random.Generator, *, band: float = 2.0,
                        pairs: int = 2) -> FloatArray:
    """Simpson's first-order values, antithetic walk estimates for the unsettled players (see
    the module docstring)."""
    if not (isinstance(band, int | float) and np.isfinite(band) and band >= 0):
        raise ValueError(f"band={band!r} must be a finite number >= 0 (the bands' width in "
                         "second differences; 0: no band, Simpson's values alone; 2.0: default)")
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs={pairs!r} must be an int >= 1 (antithetic walk pairs per "
                         "refined player; 2: the default)")
    values, halfwidth = cheap_values(game, band)
    order = unsettled(values, halfwidth, rng)
    refined = order[: refinable(len(order), game.n_players, game.remaining // pairs)]
    if refined.size:
        values[refined] = walk_values(game, rng, refined, pairs)
    return values


def first_order_simpson(game: CachedGame, rng: np.random.Generator) -> FloatArray:
    """``first-order-simpson``: Simpson's values alone, ``s_i`` of step 1 (three gradients, no
    coalition but the ends): ``first-order-refined`` with ``band = 0``, under its own name."""
    return cheap_values(game, 0.0)[0]


def cheap_values(game: CachedGame, band: float) -> tuple[FloatArray, FloatArray]:
    """Simpson's values ``s`` and band half-widths ``h`` from the three first-order terms."""
    c0, c_mid, c1 = (game.first_order(at) for at in (0.0, 0.5, 1.0))
    return (c0 + 4.0 * c_mid + c1) / 6.0, band * np.abs(c0 - 2.0 * c_mid + c1) / 6.0


def unsettled(values: FloatArray, halfwidth: FloatArray, rng: np.random.Generator) -> IntArray:
    """Players whose band overlaps another player's, widest band first (ties in random order)."""
    overlap = np.abs(values[:, None] - values[None, :]) < halfwidth[:, None] + halfwidth[None, :]
    np.fill_diagonal(overlap, False)
    players = np.flatnonzero(overlap.any(axis=1))
    tie = rng.random(players.size)
    return players[np.lexsort((tie, -halfwidth[players]))]


def walk_cost(k: int, n: int) -> int:
    """New coalitions one walk needs at most for ``k`` refined players of ``n``."""
    return min(2 * k, n - 1)


def refinable(k: int, n: int, per_pair: int) -> int:
    """How many of ``k`` unsettled players (in priority order) a pair of walks costing at most
    ``per_pair`` evaluations can refine."""
    if k == 0 or 2 * walk_cost(k, n) <= per_pair:
        return k
    return max(0, min(k, per_pair // 4))


def walk_values(game: CachedGame, rng: np.random.Generator, players: IntArray,
                pairs: int) -> FloatArray:
    """Mean pair-averaged marginal of each of ``players`` over up to ``pairs`` antithetic pairs."""
    pair_cost = 2 * walk_cost(players.size, game.n_players)
    total, done = np.zeros(players.size), 0
    while (batch := min(pairs - done, game.remaining // pair_cost)) > 0:
        total += pair_marginals(game, rng, players, batch).sum(axis=0)
        done += batch
    return total / done


def pair_marginals(game: CachedGame, rng: np.random.Generator, players: IntArray,
                   n_pairs: int) -> FloatArray:
    """``(n_pairs, k)``: each pair's mean marginal of each player, walks evaluated in one batch."""
    n, k = game.n_players, players.size
    half = stratified_uniforms(rng, n_pairs, n)
    arrivals = np.concatenate([half, 1.0 - half])  # row w + n_pairs reverses walk w
    position = np.argsort(np.argsort(arrivals, axis=1), axis=1)
    before = position[:, None, :] < position[:, players][:, :, None]  # (2 n_pairs, k, n)
    with_j = before.copy()
    with_j[:, np.arange(k), players] = True
    values = game(np.concatenate([before, with_j]).reshape(-1, n)).reshape(2, 2 * n_pairs, k)
    marginals = values[1] - values[0]
    return (marginals[:n_pairs] + marginals[n_pairs:]) / 2.0
