"""Small games with known values, for tests and benchmarks.

Every game is a callable ``game(masks) -> values`` (boolean ``(k, n)`` in, ``(k,)`` out), the
contract the estimators use.
"""

from __future__ import annotations

import json
from pathlib import Path

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


class WeightedVotingGame:
    """``nu(S) = 1`` if ``sum_{i in S} w_i >= quota`` else 0."""

    def __init__(self, weights: FloatArray, quota: float):
        self.weights = np.asarray(weights, dtype=float)
        self.quota = float(quota)
        self.n_players = len(self.weights)

    def __call__(self, masks: BoolArray) -> FloatArray:
        return (np.asarray(masks, dtype=float) @ self.weights >= self.quota).astype(float)


class TableGame:
    """A game given by the utilities of all 2^n coalitions, indexed by bit code.

    Coalition code ``c`` has player ``i`` iff bit ``i`` of ``c`` is set; ``table[0]`` is
    nu(empty) and ``table[-1]`` is nu(N).
    """

    def __init__(self, table: FloatArray, name: str = "table"):
        self.table = np.asarray(table, dtype=float)
        n = len(self.table).bit_length() - 1
        if 1 << n != len(self.table):
            raise ValueError(f"table length must be a power of two; got {len(self.table)}")
        self.n_players = n
        self.name = name
        self._bits = 1 << np.arange(n, dtype=np.int64)

    def __call__(self, masks: BoolArray) -> FloatArray:
        codes = np.asarray(masks, dtype=np.int64) @ self._bits
        return self.table[codes]

    @classmethod
    def from_json(cls, path: str | Path) -> TableGame:
        """Load a game saved by ``benchmarks/record_fl_game.py`` (key ``"utilities"``)."""
        data = json.loads(Path(path).read_text())
        return cls(np.array(data["utilities"], dtype=float), name=Path(path).stem)


def interaction_game(n: int = 10, seed: int = 0) -> AdditiveGame:
    """Additive game with sparse pairwise interactions (synergies and redundancies)."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.0, 1.0, n)
    pairs = rng.normal(0.0, 0.5, (n, n)) * (rng.random((n, n)) < 0.3)
    return AdditiveGame(weights, pairs)


def voting_game() -> WeightedVotingGame:
    """Ten voters, weights 1..6, quota 15 of 28 (a weighted majority game)."""
    return WeightedVotingGame(np.array([1, 1, 1, 2, 2, 3, 3, 4, 5, 6]), quota=15)
