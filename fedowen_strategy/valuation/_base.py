"""Shared pieces of the valuation package: the result type and the budgeted, cached game.

An estimator never calls the user's utility directly. It calls a :class:`CachedGame`, which

* checks every batch (boolean ``(k, n)`` masks in, finite ``(k,)`` floats out),
* serves coalitions already evaluated within this call from a cache, free of charge,
* charges only new distinct rows, and refuses (:class:`BudgetExhausted`) a batch whose new
  rows would take ``n_evals`` past the budget, before the utility is touched.

So ``n_evals <= budget`` holds by construction, whatever an estimator does.

A utility may also offer *first-order terms*, ``utility.first_order(at) -> (n,)`` floats: the
partial derivatives of a smooth extension ``F`` of the game (``nu(S) = F(1_S)``) along the
diagonal, ``c_i(at) = dF/dx_i (at, ..., at)`` for ``at`` in [0, 1], with ``c_i = 0`` for a null
player. The torch utility computes them with one backward pass of the evaluation loss
(:mod:`fedowen_strategy.torch_utility.gradient`); recorded games store them
(:class:`~fedowen_strategy.valuation.games.TableGame`). :meth:`CachedGame.first_order` checks
and caches them and counts the calls in ``n_gradients``, outside the evaluation budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

Utility = Callable[[NDArray[np.bool_]], Any]
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

#: The one flatness threshold: a total gain ``|nu(N) - nu(empty)|`` (or any other scale of the
#: values) below this counts as zero, so nothing is divided by it and gain-relative truncation
#: is off. Float noise in a sum of utility differences lies far below it; the gain of an
#: accuracy on any evaluation set of fewer than 10^9 examples lies above it.
FLAT = 1e-9


class BudgetExhausted(RuntimeError):
    """Raised by :class:`CachedGame` when a batch would exceed the evaluation budget."""


@dataclass(frozen=True, eq=False)
class Valuation:
    """Result of one :func:`~fedowen_strategy.valuation.estimate` call.

    Attributes
    ----------
    values : ndarray of shape (n,)
        Estimated values in the game's raw units (e.g. accuracy gained), never rescaled.
    n_evals : int
        Coalition rows actually passed to the utility (empty and grand coalitions included);
        rows served from the per-call cache are not counted. Always ``<= budget``.
    method : str
        Registered method name.
    budget : int
        The budget the call ran under.
    v_empty, v_grand : float
        nu(empty) and nu(N), evaluated within the budget for every method.
    params : dict
        The estimator's effective parameters (defaults filled in).
    n_gradients : int
        Calls of the utility's ``first_order`` (one backward pass each for the torch utility);
        not part of the evaluation budget.
    """

    values: FloatArray
    n_evals: int
    method: str
    budget: int
    v_empty: float
    v_grand: float
    params: dict[str, Any] = field(default_factory=dict)
    n_gradients: int = 0


class CachedGame:
    """A utility wrapped with input checks, a per-call cache and a hard evaluation budget."""

    def __init__(self, utility: Utility, n_players: int, budget: int) -> None:
        self.utility = utility
        self.n_players = n_players
        self.budget = budget
        self.n_evals = 0
        self.n_gradients = 0
        self._cache: dict[bytes, float] = {}
        self._first_order: dict[float, FloatArray] = {}

    @property
    def remaining(self) -> int:
        """Evaluations still available."""
        return self.budget - self.n_evals

    def _keys(self, masks: BoolArray) -> list[bytes]:
        return [row.tobytes() for row in np.packbits(masks, axis=1)]

    def _check_masks(self, masks: BoolArray) -> BoolArray:
        return check_masks(masks, self.n_players)

    def cost(self, masks: BoolArray) -> int:
        """Number of evaluations ``self(masks)`` would charge (new distinct rows)."""
        masks = self._check_masks(masks)
        return len({k for k in self._keys(masks) if k not in self._cache})

    def __call__(self, masks: BoolArray) -> FloatArray:
        """Values of the coalitions in ``masks``, evaluating only rows not seen before."""
        masks = self._check_masks(masks)
        keys = self._keys(masks)
        new: dict[bytes, int] = {}
        for i, key in enumerate(keys):
            if key not in self._cache and key not in new:
                new[key] = i
        if len(new) > self.remaining:
            raise BudgetExhausted(
                f"batch needs {len(new)} new evaluations, only {self.remaining} left"
            )
        if new:
            values = self._evaluate(masks[list(new.values())])
            self._cache.update(zip(new, values.tolist(), strict=True))
        return np.array([self._cache[k] for k in keys], dtype=np.float64)

    def evaluate_distinct(self, masks: BoolArray) -> FloatArray:
        """Evaluate rows known to be distinct and never repeated, bypassing the cache.

        Used by ``exact``, whose 2^n rows would make the cache needlessly large.
        """
        masks = self._check_masks(masks)
        if len(masks) > self.remaining:
            raise BudgetExhausted(f"batch needs {len(masks)} evaluations, {self.remaining} left")
        return self._evaluate(masks)

    def _evaluate(self, masks: BoolArray) -> FloatArray:
        raw = self.utility(masks.copy())
        values = np.asarray(raw, dtype=np.float64).reshape(-1)
        if values.shape != (len(masks),):
            raise ValueError(
                f"utility returned {np.shape(raw)} values for {len(masks)} coalitions; "
                "it must return one float per row of the (k, n) mask"
            )
        if not np.all(np.isfinite(values)):
            raise ValueError("utility returned non-finite values (NaN or inf)")
        self.n_evals += len(masks)
        return values

    def first_order(self, at: float) -> FloatArray:
        """The utility's first-order terms ``c(at)`` (see the module docstring), checked and
        cached; the first call per ``at`` counts in ``n_gradients``."""
        fn = getattr(self.utility, "first_order", None)
        if not callable(fn):
            raise ValueError(
                f"this method needs the utility's first-order terms, and "
                f"{type(self.utility).__name__} has no first_order(at) method: use the torch "
                "CoalitionUtility with game='delta' and metric='neg-loss', a recorded game "
                "with first-order terms, or a method that only evaluates coalitions")
        key = float(at)
        if key not in self._first_order:
            values = np.asarray(fn(key), dtype=np.float64).reshape(-1)
            if values.shape != (self.n_players,) or not np.all(np.isfinite(values)):
                raise ValueError(f"utility.first_order({key}) returned {values.shape} values "
                                 f"(finite: {bool(np.all(np.isfinite(values)))}); it must "
                                 f"return {self.n_players} finite floats")
            self._first_order[key] = values
            self.n_gradients += 1
        return self._first_order[key].copy()

    def ends(self) -> tuple[float, float]:
        """``(nu(empty), nu(N))``, evaluated in one batch (cached)."""
        masks = np.zeros((2, self.n_players), dtype=bool)
        masks[1] = True
        v = self(masks)
        return float(v[0]), float(v[1])


def stratified_uniforms(
    rng: np.random.Generator, n_rows: int, n_cols: int, strata: int | None = None
) -> FloatArray:
    """Uniforms in [0, 1), each column stratified over ``strata`` equal bins.

    Row ``k`` of column ``c`` lies in bin ``perm_c[k mod strata]`` for an independent random
    permutation per block of rows, so every entry is marginally U(0, 1) (unbiasedness) while a
    column's entries cover the bins evenly (variance reduction). ``strata=None`` uses one bin
    per row (the finest stratification).
    """
    n_strata = n_rows if strata is None else strata
    if n_rows == 0:
        return np.zeros((0, n_cols))
    n_blocks = -(-n_rows // n_strata)
    bins = np.concatenate(
        [rng.permuted(np.tile(np.arange(n_strata), (n_cols, 1)), axis=1).T for _ in range(n_blocks)]
    )[:n_rows]
    return (bins + rng.random((n_rows, n_cols))) / n_strata


def summarise(samples: list[FloatArray], n_players: int) -> FloatArray:
    """Per-player mean of marginal samples (0 for a player with none).

    ``samples`` holds arrays of shape (k, n) with NaN where a player got no sample.
    """
    if not samples:
        return np.zeros(n_players)
    stacked = np.concatenate(samples)
    counts = np.sum(~np.isnan(stacked), axis=0)
    filled = np.where(np.isnan(stacked), 0.0, stacked)
    return filled.sum(axis=0) / np.maximum(counts, 1)


def check_masks(masks: Any, n: int) -> BoolArray:
    """Return ``masks`` if it is a boolean (k, n) numpy array (one row per coalition), else
    raise ValueError saying what it got."""
    if not isinstance(masks, np.ndarray) or masks.dtype != np.bool_:
        got = masks.dtype if isinstance(masks, np.ndarray) else type(masks).__name__
        raise ValueError(f"masks must be a numpy bool array, got {got}; use masks.astype(bool)")
    if masks.ndim != 2 or masks.shape[1] != n:
        raise ValueError(f"masks must have shape (k, {n}) for {n} clients, got {masks.shape}")
    return masks
