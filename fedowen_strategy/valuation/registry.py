"""The registry: ``ESTIMATORS`` and ``estimate(method, utility, n_players, ...)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, FloatArray, Utility, Valuation
from fedowen_strategy.valuation.banzhaf import banzhaf
from fedowen_strategy.valuation.exact import MAX_PLAYERS, exact
from fedowen_strategy.valuation.first_order import first_order
from fedowen_strategy.valuation.gtg import gtg_greedyfed
from fedowen_strategy.valuation.owen import antithetic_min_budget, owen, owen_antithetic
from fedowen_strategy.valuation.owen_paper import owen_paper
from fedowen_strategy.valuation.permutation import gtg_shapley, loo, mc_shapley, weighted_shap
from fedowen_strategy.valuation.refined import first_order_refined, first_order_simpson
from fedowen_strategy.valuation.regression import kadd_shap, kernel_shap, leverage_shap
from fedowen_strategy.valuation.svarm import svarm


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered method: its function and the smallest budget it can use.

    ``fn(game, rng, **params) -> values`` gets a :class:`CachedGame` whose ``nu(empty)`` and
    ``nu(N)`` are already evaluated (``game.ends()`` serves them from the cache), so every
    minimum budget counts those two rows. ``uses_first_order``: the method calls
    ``game.first_order`` (the utility must offer first-order terms: the torch utility's delta
    game with neg-loss, or a recorded game). ``ends_from_gradients``: it takes the terms at 0
    and 1, so :func:`estimate` asks for those before the ends, whose values the torch
    utility's backward passes then give at no forward (the budget still counts both rows).
    """

    name: str
    fn: Callable[..., FloatArray]
    min_budget: Callable[[int], int]
    needs: str  # what the minimum budget buys, for the error message
    uses_first_order: bool = False
    ends_from_gradients: bool = False

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


def _loo_min(n: int) -> int:
    return n + 2 if n > 1 else 2  # with one player, N without it is the empty coalition


ESTIMATORS: Mapping[str, EstimatorSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            EstimatorSpec("exact", exact, lambda n: 1 << n, "all 2^n coalitions"),
            EstimatorSpec("owen", owen, _walk_min, "nu(empty), nu(N) and one walk or mask"),
            EstimatorSpec("owen-antithetic", owen_antithetic, antithetic_min_budget,
                          "nu(empty), nu(N) and one antithetic pair of walks"),
            EstimatorSpec("owen-paper", owen_paper, lambda n: 2, "nu(empty) and nu(N)"),
            EstimatorSpec("mc-shapley", mc_shapley, _walk_min, "nu(empty), nu(N), one walk"),
            EstimatorSpec("gtg-shapley", gtg_shapley, _walk_min, "nu(empty), nu(N), one walk"),
            EstimatorSpec("gtg-greedyfed", gtg_greedyfed, _walk_min,
                          "nu(empty), nu(N), one walk"),
            EstimatorSpec("banzhaf", banzhaf, lambda n: 4, "nu(empty), nu(N) and two subsets"),
            EstimatorSpec("weighted-shap", weighted_shap, _walk_min, "nu(empty), nu(N), one walk"),
            EstimatorSpec("loo", loo, _loo_min, "nu(empty), nu(N) and the n leave-one-out "
                          "coalitions"),
            EstimatorSpec("svarm", svarm, lambda n: 2, "nu(empty) and nu(N)"),
            EstimatorSpec("kernel-shap", kernel_shap, lambda n: 2, "nu(empty) and nu(N)"),
            EstimatorSpec("leverage-shap", leverage_shap, lambda n: 2, "nu(empty) and nu(N)"),
            EstimatorSpec("kadd-shap", kadd_shap, lambda n: 2, "nu(empty) and nu(N)"),
            EstimatorSpec("first-order", first_order, lambda n: 2, "nu(empty) and nu(N)",
                          uses_first_order=True),
            EstimatorSpec("first-order-refined", first_order_refined, lambda n: 2,
                          "nu(empty) and nu(N)", uses_first_order=True,
                          ends_from_gradients=True),
            EstimatorSpec("first-order-simpson", first_order_simpson, lambda n: 2,
                          "nu(empty) and nu(N)", uses_first_order=True,
                          ends_from_gradients=True),
        )
    }
)


def estimate_problems(method: str, n_players: Any, budget: Any,
                      params: Mapping[str, Any]) -> list[str]:
    """Everything :func:`estimate` would refuse about a call, without calling the utility:
    an unknown method, a bad ``n_players`` or ``budget``, a budget below the method's minimum
    for ``n_players``, parameters the method does not accept or of the wrong type."""
    spec = ESTIMATORS.get(method) if isinstance(method, str) else None
    if spec is None:
        return [f"unknown method {method!r}; valid methods: {', '.join(ESTIMATORS)}"]
    if isinstance(n_players, bool) or not isinstance(n_players, int | np.integer) or n_players < 1:
        return [f"n_players must be a positive int; got {n_players!r}"]
    problems = []
    if spec.name == "exact" and n_players > MAX_PLAYERS:
        problems.append(f"'exact' enumerates all 2^n coalitions and refuses n_players="
                        f"{n_players} > {MAX_PLAYERS}; use a sampling method such as 'owen'")
    if isinstance(budget, bool) or not isinstance(budget, int | np.integer):
        problems.append(f"budget must be an int (utility evaluations); got {budget!r}")
    elif budget < (need := spec.min_budget(int(n_players))):
        problems.append(f"budget={budget} is too small for {spec.name!r} with n_players="
                        f"{n_players}: it needs at least {need} evaluations ({spec.needs})")
    defaults = spec.defaults
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        valid = ", ".join(f"{k}={v!r}" for k, v in defaults.items()) or "none"
        problems.append(f"unknown parameter(s) {unknown} for {spec.name!r}; valid parameters: "
                        f"{valid}")
    for key in sorted(set(params) & set(defaults)):
        problems += _type_problem(spec.name, key, params[key], defaults[key])
    return problems


def _type_problem(method: str, key: str, value: Any, default: Any) -> list[str]:
    """A problem when ``value`` cannot stand in for ``default`` (an int may replace a float)."""
    if default is None or isinstance(value, type(default)):
        return []
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return []
    return [f"{method} parameter {key}={value!r} should be {type(default).__name__} "
            f"(default {default!r})"]


def _check_call(spec: EstimatorSpec, n_players: Any, budget: Any, params: dict[str, Any]) -> None:
    problems = estimate_problems(spec.name, n_players, budget, params)
    if problems:
        raise ValueError("; ".join(problems))


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
        One of ``ESTIMATORS`` (``exact``, ``owen``, ``owen-antithetic``, ``owen-paper``,
        ``mc-shapley``, ``gtg-shapley``, ``gtg-greedyfed``, ``banzhaf``, ``weighted-shap``,
        ``loo``, ``svarm``, ``kernel-shap``, ``leverage-shap``, ``kadd-shap``,
        ``first-order``, ``first-order-refined``, ``first-order-simpson``).
    utility : callable
        ``utility(masks) -> values`` with ``masks`` a boolean ``(k, n)`` array and ``values``
        ``k`` floats. Called with batches; never with a coalition already evaluated in this call.
        Methods with ``uses_first_order`` also call ``utility.first_order(at)`` (see
        :mod:`fedowen_strategy.valuation._base`).
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
    for at in (0.0, 1.0) if spec.ends_from_gradients else ():
        game.first_order(at)  # its passes score the ends too (the torch utility)
    v_empty, v_grand = game.ends()  # within the budget, for every method (the round's record)
    values = spec.fn(game, rng, **params)
    return Valuation(
        values=np.asarray(values, dtype=np.float64),
        n_evals=game.n_evals,
        method=method,
        budget=int(budget),
        v_empty=v_empty,
        v_grand=v_grand,
        params={**spec.defaults, **params},
        n_gradients=game.n_gradients,
    )
