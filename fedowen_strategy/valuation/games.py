"""Small games with known values, for tests and benchmarks.

Every game is a callable ``game(masks) -> values`` (boolean ``(k, n)`` in, ``(k,)`` out), the
contract the estimators use.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedowen_strategy.valuation._base import BoolArray, FloatArray


class AdditiveGame:
    """``nu(S) = sum_{i in S} a_i + sum_{i<j in S} b_ij`` (+ ``offset``).

    Shapley values in closed form: ``phi_i = a_i + sum_j b_ij / 2`` (each pair interaction split
    evenly). With ``b = 0`` every estimator built from marginals is exact.
    """

    def __init__(self, weights: FloatArray, pairs: FloatArray | None = None, offset: float = 0.0):
        self.weights = np.asarray(weights, dtype=float)
        n = len(self.weights)
        b = np.zeros((n, n)) if pairs is None else np.asarray(pairs, dtype=float)
        self.pairs = np.triu(b, 1)
        self.offset = offset
        self.n_players = n

    def __call__(self, masks: BoolArray) -> FloatArray:
        x = np.asarray(masks, dtype=float)
        quad = np.einsum("ki,ij,kj->k", x, self.pairs, x)
        return self.offset + x @ self.weights + quad

    def shapley_values(self) -> FloatArray:
        """Closed-form Shapley values."""
        sym = self.pairs + self.pairs.T
        return self.weights + sym.sum(axis=1) / 2.0

    def first_order(self, at: float) -> FloatArray:
        """First-order terms of the extension ``F(x) = offset + a.x + x'Bx``:
        ``dF/dx_i (at, ..., at) = a_i + at * sum_j (B + B')_ij`` (the Shapley value at 1/2)."""
        sym = self.pairs + self.pairs.T
        return self.weights + at * sym.sum(axis=1)


class WeightedVotingGame:
    """``nu(S) = 1`` if ``sum_{i in S} w_i >= quota`` else 0."""

    def __init__(self, weights: FloatArray, quota: float):
        self.weights = np.asarray(weights, dtype=float)
        self.quota = float(quota)
        self.n_players = len(self.weights)

    def __call__(self, masks: BoolArray) -> FloatArray:
        return (np.asarray(masks, dtype=float) @ self.weights >= self.quota).astype(float)

    def shapley_values(self) -> FloatArray:
        """Shapley values by counting swings (integer weights; see :func:`voting_shapley`)."""
        return voting_shapley(self.weights, self.quota)


class TableGame:
    """A game given by the utilities of all 2^n coalitions, indexed by bit code.

    Coalition code ``c`` has player ``i`` iff bit ``i`` of ``c`` is set; ``table[0]`` is
    nu(empty) and ``table[-1]`` is nu(N). ``first_order`` maps points ``at`` to recorded
    first-order terms (``n`` floats each), served by :meth:`first_order`; ``meta`` keeps what
    else the recording said (dataset, round, ...).
    """

    def __init__(self, table: FloatArray, name: str = "table",
                 first_order: Mapping[float, FloatArray] | None = None,
                 meta: Mapping[str, Any] | None = None):
        self.table = np.asarray(table, dtype=float)
        n = len(self.table).bit_length() - 1
        if 1 << n != len(self.table):
            raise ValueError(f"table length must be a power of two; got {len(self.table)}")
        self.n_players = n
        self.name = name
        self.meta = dict(meta or {})
        self._first_order = {float(k): np.asarray(v, dtype=float)
                             for k, v in (first_order or {}).items()}
        for at, terms in self._first_order.items():
            if terms.shape != (n,):
                raise ValueError(f"first-order terms at {at} have shape {terms.shape}, need ({n},)")
        self._bits = 1 << np.arange(n, dtype=np.int64)

    def __call__(self, masks: BoolArray) -> FloatArray:
        codes = np.asarray(masks, dtype=np.int64) @ self._bits
        return self.table[codes]

    def first_order(self, at: float) -> FloatArray:
        """The recorded first-order terms at ``at`` (a ValueError names the recorded points)."""
        if float(at) not in self._first_order:
            raise ValueError(f"{self.name}: no first-order terms recorded at {at}; recorded: "
                             f"{sorted(self._first_order) or 'none'}")
        return self._first_order[float(at)].copy()

    @classmethod
    def from_json(cls, path: str | Path) -> TableGame:
        """Load a recorded game: ``benchmarks/record_fl_game.py``'s JSON (key ``"utilities"``)
        or ``benchmarks/record_app_games.py``'s gzipped JSON (also ``"first_order"``, a map
        from ``at`` to n terms, and ``"meta"``)."""
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            data = json.load(fh)
        name = path.name.removesuffix(".gz").removesuffix(".json")
        terms = {float(k): np.asarray(v, dtype=float)
                 for k, v in data.get("first_order", {}).items()}
        return cls(np.array(data["utilities"], dtype=float), name=name, first_order=terms,
                   meta=data.get("meta"))


def interaction_game(n: int = 10, seed: int = 0) -> AdditiveGame:
    """Additive game with sparse pairwise interactions (synergies and redundancies)."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.0, 1.0, n)
    pairs = rng.normal(0.0, 0.5, (n, n)) * (rng.random((n, n)) < 0.3)
    return AdditiveGame(weights, pairs)


def voting_game() -> WeightedVotingGame:
    """Ten voters, weights 1..6, quota 15 of 28 (a weighted majority game)."""
    return WeightedVotingGame(np.array([1, 1, 1, 2, 2, 3, 3, 4, 5, 6]), quota=15)


def _size_weights(n: int) -> FloatArray:
    """Shapley weight ``s! (n - s - 1)! / n!`` of a coalition of size s of the others."""
    return np.array([1.0 / (n * math.comb(n - 1, s)) for s in range(n)])


class GloveGame:
    """``nu(S) = min(|S & L|, |S & R|)``: players ``0..n_left-1`` hold left gloves, the rest right.

    Shapley values in closed form (a sum over how many left and right gloves come before i).
    """

    def __init__(self, n_left: int, n_right: int):
        self.n_left, self.n_right = n_left, n_right
        self.n_players = n_left + n_right
        self._left = np.arange(self.n_players) < n_left

    def __call__(self, masks: BoolArray) -> FloatArray:
        m = np.asarray(masks, dtype=bool)
        return np.minimum(m[:, self._left].sum(1), m[:, ~self._left].sum(1)).astype(float)

    def _one(self, own: int, other: int) -> float:
        """Value of a player whose side has ``own`` players and the other side ``other``."""
        w = _size_weights(self.n_players)
        return sum(w[a + b] * math.comb(own - 1, a) * math.comb(other, b)
                   for a in range(own) for b in range(other + 1) if a < b)  # fmt: skip

    def shapley_values(self) -> FloatArray:
        """Closed-form Shapley values."""
        left, right = self._one(self.n_left, self.n_right), self._one(self.n_right, self.n_left)
        return np.where(self._left, left, right)


class AirportGame:
    """Cost game ``nu(S) = max_{i in S} c_i`` (a runway long enough for every plane in S).

    Shapley values (Littlechild and Owen 1973): with costs sorted ascending,
    ``phi_(k) = sum_{j <= k} (c_(j) - c_(j-1)) / (n - j + 1)``.
    """

    def __init__(self, costs: FloatArray):
        self.costs = np.asarray(costs, dtype=float)
        self.n_players = len(self.costs)

    def __call__(self, masks: BoolArray) -> FloatArray:
        m = np.asarray(masks, dtype=bool)
        return np.where(m, self.costs, 0.0).max(axis=1, initial=0.0)

    def shapley_values(self) -> FloatArray:
        """Closed-form Shapley values."""
        order = np.argsort(self.costs, kind="stable")
        c = np.concatenate([[0.0], self.costs[order]])
        n = self.n_players
        shares = np.cumsum(np.diff(c) / (n - np.arange(n)))
        out = np.empty(n)
        out[order] = shares
        return out


def voting_shapley(weights: FloatArray, quota: float) -> FloatArray:
    """Shapley values of a weighted voting game with integer weights (counting swings by DP)."""
    w = np.asarray(weights, dtype=np.int64)
    n, total = len(w), int(w.sum())
    size_w = _size_weights(n)
    out = np.empty(n)
    for i in range(n):
        ways = np.zeros((n, total + 1))  # ways[s, t]: coalitions of the others, size s, weight t
        ways[0, 0] = 1.0
        for j in np.delete(np.arange(n), i):
            ways[1:, w[j]:] += ways[:-1, : total + 1 - w[j]].copy()
        lo, hi = max(math.ceil(quota - w[i]), 0), math.ceil(quota)
        out[i] = float(size_w @ ways[:, lo:hi].sum(axis=1))
    return out


class SoumGame:
    """Sum of unanimity games ``nu(S) = sum_k c_k [T_k subset of S]``; ``phi_i = sum_{T_k ni i}
    c_k / |T_k|`` (each unanimity game's worth split evenly among its carriers)."""

    def __init__(self, carriers: BoolArray, coefficients: FloatArray):
        self.carriers = np.asarray(carriers, dtype=bool)
        self.coefficients = np.asarray(coefficients, dtype=float)
        self.n_players = self.carriers.shape[1]

    def __call__(self, masks: BoolArray) -> FloatArray:
        m = np.asarray(masks, dtype=np.int64)
        inside = m @ self.carriers.T.astype(np.int64) == self.carriers.sum(axis=1)
        return inside.astype(float) @ self.coefficients

    def shapley_values(self) -> FloatArray:
        """Closed-form Shapley values."""
        share = self.coefficients / self.carriers.sum(axis=1)
        return share @ self.carriers.astype(float)


def reference_games(n: int, seed: int = 0) -> dict[str, object]:
    """The benchmark's games with closed-form values at ``n`` players (seeded)."""
    rng = np.random.default_rng([seed, n])
    sizes = rng.integers(1, n + 1, size=3 * n)  # SOUM: 3n unanimity games of random sizes
    carriers = random_carriers(rng, n, sizes)
    costs = rng.integers(1, 100, n).astype(float)
    votes = rng.integers(1, 10, n)
    return {
        "glove": GloveGame(n // 2 - 1, n - n // 2 + 1),
        "airport": AirportGame(costs),
        "voting": WeightedVotingGame(votes.astype(float), quota=int(votes.sum()) // 2 + 1),
        "soum": SoumGame(carriers, rng.normal(0.0, 1.0, len(sizes))),
    }


def random_carriers(rng: np.random.Generator, n: int, sizes: np.ndarray) -> BoolArray:
    """One uniformly random coalition of each size (unanimity carriers)."""
    ranks = np.argsort(np.argsort(rng.random((len(sizes), n)), axis=1), axis=1)
    return ranks < sizes[:, None]
