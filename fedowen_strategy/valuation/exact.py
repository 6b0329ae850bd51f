"""``exact``: the Shapley value from all 2^n coalitions (n <= 20).

``phi_i = sum_{S not containing i} |S|! (n - |S| - 1)! / n! * (nu(S + i) - nu(S))``, with the
coalitions indexed by bit masks (bit i set when player i is in), evaluated in chunks.
"""

from __future__ import annotations

import math

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, FloatArray

MAX_PLAYERS = 20
_CHUNK = 1 << 15


def all_coalitions(n: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Boolean masks of coalitions ``start..stop-1``; row ``c`` has player ``i`` iff bit i of c."""
    stop = (1 << n) if stop is None else stop
    codes = np.arange(start, stop, dtype=np.int64)
    return ((codes[:, None] >> np.arange(n)) & 1).astype(bool)


def shapley_from_table(table: FloatArray) -> FloatArray:
    """Shapley values from the utilities of all 2^n coalitions, indexed by bit code."""
    n = len(table).bit_length() - 1
    codes = np.arange(1 << n, dtype=np.int64)
    sizes = np.zeros(1 << n, dtype=np.int64)
    for i in range(n):
        sizes += (codes >> i) & 1
    weights = np.array(
        [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)]
    )
    values = np.empty(n)
    for i in range(n):
        without = codes[((codes >> i) & 1) == 0]
        values[i] = np.sum(weights[sizes[without]] * (table[without | (1 << i)] - table[without]))
    return values


def exact(game: CachedGame, rng: np.random.Generator) -> FloatArray:
    """Exact Shapley values by full enumeration (the registry refuses n > 20).

    The empty and grand coalitions come from the game's cache (the registry evaluated them);
    the 2^n - 2 others are evaluated once each, bypassing the cache.
    """
    n = game.n_players
    total = 1 << n
    table = np.empty(total)
    table[0], table[-1] = game.ends()
    for start in range(1, total - 1, _CHUNK):
        stop = min(start + _CHUNK, total - 1)
        table[start:stop] = game.evaluate_distinct(all_coalitions(n, start, stop))
    return shapley_from_table(table)
