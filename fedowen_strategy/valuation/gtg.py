"""``gtg-greedyfed``: GTG-Shapley (Liu et al. 2022) as GreedyFed's code runs it.

Liu, Chen, Yu, Yang and Li (2022), "GTG-Shapley: Efficient and accurate participant
contribution evaluation in federated learning"; run as in GreedyFed (Singhal, Pandey, Popovski,
IEEE Networking Letters 2024; pringlesinghal/GreedyFed, ``Server.shapley_values_gtg``):

* **between-round truncation**: when ``|nu(N) - nu(empty)| < eps`` the round is not valued and
  every player gets :data:`TRUNCATED` (the reference's ``1e-9``), after the two end evaluations;
* **guided sweeps**: each sweep runs ``n`` permutations, player ``i`` leading the ``i``-th and
  the others in random order after it, so every player leads once a sweep;
* **within-round truncation**: a walk stops once ``|nu(N) - nu(prefix)| < eps``, the players
  after that point get marginal 0;
* a player's value is the mean of its marginals over all permutations so far;
* **convergence**, checked after each sweep: the history ``h`` of the players' mean value
  after each permutation (``h_0 = 0``) has at least ``window`` entries and
  ``mean(|h[-window/2:] - h[-1]|) / |h[-1]| < tol`` (GreedyFed's ``convergenceTest``, 20 and
  its last 10 at 1%);
* at most ``cap * n`` permutations.

Every untruncated walk telescopes to ``nu(N) - nu(empty)``, so ``h`` is constant and the test
passes as soon as ``h`` is long enough: the method runs ``n * ceil((window - 1) / n)``
permutations (20 for n = 2, 21 for n = 3) unless the budget stops it first.

Differences from the reference, all in cost, none in the values of a full sweep:

* evaluations are counted as the library counts them (``Valuation.n_evals``: distinct new
  coalitions; ``nu(N)`` and a coalition seen before in the call are not charged again); the
  reference re-evaluates both, so its count is ``2 +`` every prefix a walk evaluates,
  the last included (2 clients: 42 against 4 here);
* the leaders of a sweep take their turns in random order (the reference: in id order). A full
  sweep's values are the same in distribution; a sweep the budget cuts short has random
  leaders instead of the lowest ids;
* the run stops where the next walk might not fit in the budget (the reference has none).
"""

from __future__ import annotations

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, FloatArray
from fedowen_strategy.valuation._walks import IntArray, run_walks

#: Each player's value in a round the between-round truncation skips (GreedyFed's ``1e-9``).
TRUNCATED = 1e-9


def gtg_greedyfed(game: CachedGame, rng: np.random.Generator, *, eps: float = 1e-4,
                  tol: float = 0.01, window: int = 20, cap: int = 50) -> FloatArray:
    """GTG-Shapley with GreedyFed's truncations, sweeps and stopping rule (module
    docstring); the values of :func:`gtg_run`."""
    return gtg_run(game, rng, eps=eps, tol=tol, window=window, cap=cap)[0]


def gtg_run(game: CachedGame, rng: np.random.Generator, *, eps: float = 1e-4,
            tol: float = 0.01, window: int = 20, cap: int = 50) -> tuple[FloatArray, int]:
    """The values and the number of permutations run.

    Raises
    ------
    ValueError
        For ``eps < 0``, ``tol <= 0``, ``window < 2`` or ``cap < 1``.
    """
    _check(eps, tol, window, cap)
    n = game.n_players
    v0, v1 = game.ends()
    if abs(v1 - v0) < eps:
        return np.full(n, TRUNCATED), 0
    sums, history = np.zeros(n), [0.0]
    while len(history) - 1 < cap * n:
        walks = min(n, _capacity(game))
        if walks == 0:
            break
        marginals = run_walks(game, guided_orders(rng, n)[:walks], v0, v1, tol=eps)
        for row in marginals:
            sums += row
            history.append(float(sums.mean()) / len(history))
        if walks < n or converged(history, tol, window):
            break
    return sums / max(len(history) - 1, 1), len(history) - 1


def guided_orders(rng: np.random.Generator, n: int) -> IntArray:
    """One sweep of guided permutations, one row each: every player leads one, the others
    follow in random order; the rows in random order."""
    orders = np.empty((n, n), dtype=np.int64)
    for row, lead in enumerate(rng.permutation(n).tolist()):
        others = np.delete(np.arange(n), lead)
        orders[row] = np.r_[lead, rng.permutation(others)]
    return orders


def converged(history: list[float], tol: float = 0.01, window: int = 20) -> bool:
    """GreedyFed's ``convergenceTest``: at least ``window`` entries, and the mean absolute
    distance of the last ``window // 2`` from the last below ``tol`` of the last's size (never
    when the last is 0: the reference divides by it)."""
    if len(history) < window or history[-1] == 0.0:
        return False
    tail = np.asarray(history[-(window // 2):])
    return bool(np.mean(np.abs(tail - history[-1])) / abs(history[-1]) < tol)


def _capacity(game: CachedGame) -> int:
    """Walks that surely fit in the remaining budget: ``n - 1`` new rows each at worst
    (``nu(N)`` is known), none for one player."""
    n = game.n_players
    return n if n == 1 else game.remaining // (n - 1)


def _check(eps: float, tol: float, window: int, cap: int) -> None:
    if eps < 0:
        raise ValueError(f"eps must be >= 0 (absolute, in the utility's units); got {eps}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0 (the convergence test's relative change); got {tol}")
    if window < 2:
        raise ValueError(f"window must be >= 2 (history entries before the convergence "
                         f"test); got {window}")
    if cap < 1:
        raise ValueError(f"cap must be >= 1 (permutations per player at most); got {cap}")
