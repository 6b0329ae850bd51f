"""The registry: ``ESTIMATORS`` and ``estimate(method, utility, n_players, ...)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, Estimate, Utility, Valuation
from fedowen_strategy.valuation.banzhaf import banzhaf
from fedowen_strategy.valuation.exact import MAX_PLAYERS, exact
from fedowen_strategy.valuation.owen import owen, owen_paper
from fedowen_strategy.valuation.permutation import gtg_shapley, loo, mc_shapley, weighted_shap


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered method: its function and the smallest budget it can use."""

    name: str
    fn: Callable[..., Estimate]
    min_budget: Callable[[int], int]
    needs: str  # what the minimum budget buys, for the error message

    @property
    def defaults(self) -> dict[str, Any]:
        """Keyword parameters and their defaults."""
        sig = inspect.signature(self.fn)
        return {
            p.name: p.default
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }


def _walk_min(n: int) -> int:
    return n + 1


ESTIMATORS: Mapping[str, EstimatorSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            EstimatorSpec("exact", exact, lambda n: 1 << n, "all 2^n coalitions"),
            EstimatorSpec("owen", owen, _walk_min, "nu(empty), nu(N) and one walk or mask"),
            EstimatorSpec("owen-paper", owen_paper, lambda n: 2, "nu(empty) and nu(N)"),
            EstimatorSpec("mc-shapley", mc_shapley, _walk_min, "nu(empty), nu(N), one walk"),
            EstimatorSpec("gtg-shapley", gtg_shapley, _walk_min, "nu(empty), nu(N), one walk"),
            EstimatorSpec("banzhaf", banzhaf, lambda n: 2, "two subsets"),
            EstimatorSpec("weighted-shap", weighted_shap, _walk_min, "nu(empty), nu(N), one walk"),
            EstimatorSpec("loo", loo, _walk_min, "nu(N) and the n leave-one-out coalitions"),
        )
    }
)


def _check_call(spec: EstimatorSpec, n_players: Any, budget: Any, params: dict[str, Any]) -> None:
    if isinstance(n_players, bool) or not isinstance(n_players, int | np.integer) or n_players < 1:
        raise ValueError(f"n_players must be a positive int; got {n_players!r}")
    if spec.name == "exact" and n_players > MAX_PLAYERS:
        raise ValueError(
            f"'exact' enumerates all 2^n coalitions and refuses n_players={n_players} "
            f"> {MAX_PLAYERS}; use a sampling method such as 'owen'"
        )
    if isinstance(budget, bool) or not isinstance(budget, int | np.integer):
        raise ValueError(f"budget must be an int (utility evaluations); got {budget!r}")
    need = spec.min_budget(int(n_players))
    if budget < need:
        raise ValueError(
            f"budget={budget} is too small for {spec.name!r} with n_players={n_players}: "
            f"it needs at least {need} evaluations ({spec.needs})"
        )
    unknown = sorted(set(params) - set(spec.defaults))
    if unknown:
        valid = ", ".join(f"{k}={v!r}" for k, v in spec.defaults.items()) or "none"
        raise ValueError(
            f"unknown parameter(s) {unknown} for {spec.name!r}; valid parameters: {valid}"
        )


def estimate(
    method: str,
    utility: Utility,
    n_players: int,
    *,
    budget: int,
    seed: int | np.random.Generator,
    **params: Any,
) -> Valuation:
    """Estimate the players' values of a game with a registered method.

    Parameters
    ----------
    method : str
        One of ``ESTIMATORS`` (``exact``, ``owen``, ``owen-paper``, ``mc-shapley``,
        ``gtg-shapley``, ``banzhaf``, ``weighted-shap``, ``loo``).
    utility : callable
        ``utility(masks) -> values`` with ``masks`` a boolean ``(k, n)`` array and ``values``
        ``k`` floats. Called with batches; never with a coalition already evaluated in this call.
    n_players : int
        Number of players ``n``.
    budget : int
        Maximum number of coalition rows passed to ``utility`` (``n_evals <= budget``).
    seed : int or numpy.random.Generator
        Source of randomness; the same seed gives the same values.
    **params
        Method parameters; see ``ESTIMATORS[method].defaults``.

    Returns
    -------
    Valuation
    """
    spec = ESTIMATORS.get(method) if isinstance(method, str) else None
    if spec is None:
        raise ValueError(f"unknown method {method!r}; valid methods: {', '.join(ESTIMATORS)}")
    if seed is None or isinstance(seed, bool) or not isinstance(
        seed, int | np.integer | np.random.Generator
    ):
        raise ValueError(f"seed must be an int or a numpy.random.Generator; got {seed!r}")
    _check_call(spec, n_players, budget, params)
    rng = np.random.default_rng(seed)
    game = CachedGame(utility, int(n_players), int(budget))
    result = spec.fn(game, rng, **params)
    return Valuation(
        values=result.values,
        n_evals=game.n_evals,
        method=method,
        budget=int(budget),
        stderr=result.stderr,
        n_samples=result.n_samples,
        n_truncated=result.n_truncated,
        v_empty=result.v_empty,
        v_grand=result.v_grand,
        params={**spec.defaults, **params},
    )
