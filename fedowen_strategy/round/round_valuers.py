"""The valuation methods of a round, in one table, and how their values become weights.

:data:`ROUND_VALUERS` maps every method the strategy accepts to its valuer (the game
estimators, ShapFed-WA, ``none`` and ``multikrum``); the method lists derive from it.
:func:`fedowen_strategy.round.contribution.value_round` runs the configured one.

Scale of phi (:func:`scale_phi`; this module owns it). Estimators return values in the
utility's raw units (accuracy gained): a few hundredths per client, and ``softmax(phi)`` of
such numbers is nearly uniform, so the paper's aggregation would silently be FedAvg.
``phi-scale`` puts them on a unit scale:

* ``l1`` (default): ``phi / sum|phi|``; ``|phi| <= 1`` always.
* ``normalised``: ``phi / |nu(N) - nu(empty)|``, the scale Algorithm 1 works on; an efficient
  estimator's values then sum to the sign of the round's gain. It equals ``l1`` when all
  contributions share the gain's sign, but when they nearly cancel it inflates them without
  bound and softmax gives one client all the weight: that is why ``l1`` is the default
  (measurements: docs/results/phi-scale-mnist/).
* ``raw``: unchanged.

A scale below :data:`~fedowen_strategy.valuation.FLAT` leaves the values raw (all ~0, so the
softmax weights are uniform).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.round.aggregation import mix_and_cap, round_weights
from fedowen_strategy.shapfed import last_layer_key, shapfed_scores
from fedowen_strategy.valuation import ESTIMATORS, FLAT, estimate

Utility = Callable[[NDArray[np.bool_]], NDArray[np.float64]]
#: ``(global_state, client_states, num_examples[, shares=p]) -> utility``; ``shares`` is passed
#: only for the delta game.
UtilityFactory = Callable[..., Utility]


class ValuerSettings(Protocol):
    """What a valuer reads of its settings
    (:class:`fedowen_strategy.round.contribution.ValuationSettings`, which owns their rules)."""

    @property
    def method(self) -> str: ...
    @property
    def budget_m(self) -> int: ...
    @property
    def params(self) -> Mapping[str, Any]: ...
    @property
    def phi_scale(self) -> str: ...
    @property
    def temperature(self) -> float: ...
    @property
    def krum_malicious(self) -> int: ...
    @property
    def aggregation(self) -> str: ...
    @property
    def game(self) -> str: ...
    @property
    def uniform_mix(self) -> float: ...
    @property
    def weight_cap(self) -> float: ...


@dataclass(frozen=True)
class RoundValuation:
    """One round's valuation: the estimate's values (``phi_raw``), their scaled form and the
    aggregation weights, all aligned with the updates, and the round's cost and end points."""

    phi: NDArray[np.float64]
    phi_raw: NDArray[np.float64]
    weights: NDArray[np.float64]
    n_evals: int
    seconds: float
    nu_empty: float = float("nan")
    nu_full: float = float("nan")


def multikrum_keep(states: Sequence[Mapping[str, NDArray]], malicious: int) -> NDArray[np.bool_]:
    """Which updates Flower's Multi-Krum keeps (n - f of n, f = ``malicious``)."""
    from flwr.app import RecordDict
    from flwr.serverapp.strategy.multikrum import select_multikrum

    from fedowen_strategy.replies import state_to_record

    n = len(states)
    if n <= 2 * malicious + 2:  # Krum's guarantee needs n > 2f + 2; with fewer keep all
        return np.ones(n, dtype=bool)
    contents = [RecordDict({"arrays": state_to_record(s)}) for s in states]
    chosen = {id(c) for c in select_multikrum(contents, malicious, n - malicious)}
    return np.array([id(c) in chosen for c in contents])


def _weights(settings: ValuerSettings, phi: NDArray[np.float64],
             num_examples: Sequence[int]) -> NDArray[np.float64]:
    """The aggregation's weights, mixed with uniform and capped as configured."""
    weights = round_weights(settings.aggregation, phi, num_examples, settings.temperature)
    return mix_and_cap(weights, settings.uniform_mix, settings.weight_cap)


def delta_shares(aggregation: str, num_examples: Sequence[int]) -> NDArray[np.float64]:
    """The delta game's shares p: the weights the server applies before contributions are
    known, i.e. FedAvg's ``n_i / n`` for ``examples`` and ``1 / n`` otherwise (softmax's weights
    at T -> infinity; its applied weights depend on phi itself, so they cannot define the game).
    Linked updates are one player already (:func:`value_round`), so a copy never counts twice.
    """
    how = "examples" if aggregation == "examples" else "uniform"
    return round_weights(how, np.zeros(len(num_examples)), num_examples)


def scale_phi(phi_raw: NDArray[np.float64], gain: float, scale: str) -> NDArray[np.float64]:
    """Put raw contributions on the configured scale (see the module docstring).

    ``normalised``: ``phi / |gain|``; ``l1``: ``phi / sum|phi|`` (equal to ``normalised`` when
    all contributions share the gain's sign, bounded by 1 in absolute value when they cancel);
    ``raw``: unchanged. A scale below ``FLAT`` leaves the values raw.
    """
    denom = {"normalised": abs(gain), "l1": float(np.abs(phi_raw).sum()), "raw": 1.0}[scale]
    return phi_raw / denom if denom >= FLAT else phi_raw


def round_budget(method: str, n: int, budget_m: int) -> int:
    """Utility calls one round may spend on ``n`` updates: ``n x M``, all 2^n for ``exact``."""
    return 2**n if method == "exact" else n * budget_m


@dataclass(frozen=True)
class RoundInputs:
    """What a round valuer sees: the updates, their example counts and the global model."""

    states: Sequence[Mapping[str, NDArray]]
    num_examples: Sequence[int]
    global_state: Mapping[str, NDArray]
    settings: ValuerSettings


def _fedavg(r: RoundInputs, factory: UtilityFactory | None, rng: np.random.Generator
            ) -> RoundValuation:
    zeros = np.zeros(len(r.states))
    weights = round_weights(r.settings.aggregation, zeros, r.num_examples)
    return RoundValuation(zeros, zeros, weights, 0, 0.0)


def _multikrum(r: RoundInputs, factory: UtilityFactory | None, rng: np.random.Generator
               ) -> RoundValuation:
    kept = multikrum_keep(r.states, r.settings.krum_malicious)
    base = round_weights(r.settings.aggregation, kept.astype(np.float64), r.num_examples)
    weights = np.where(kept, base, 0.0)
    return RoundValuation(kept.astype(np.float64), kept.astype(np.float64),
                          weights / weights.sum(), 0, 0.0)


def _shapfed(r: RoundInputs, factory: UtilityFactory | None, rng: np.random.Generator
             ) -> RoundValuation:
    key = last_layer_key(r.global_state)
    phi = shapfed_scores([s[key] for s in r.states], r.global_state[key])
    return RoundValuation(phi, phi, _weights(r.settings, phi, r.num_examples), 0, 0.0)


def _game(r: RoundInputs, factory: UtilityFactory | None, rng: np.random.Generator
          ) -> RoundValuation:
    settings, n = r.settings, len(r.states)
    if factory is None:
        raise ValueError(f"valuation={settings.method!r} needs a utility over coalitions")
    utility = (factory(r.global_state, r.states, r.num_examples) if settings.game == "average"
               else factory(r.global_state, r.states, r.num_examples,
                            shares=delta_shares(settings.aggregation, r.num_examples)))
    result = estimate(settings.method, utility, n,
                      budget=round_budget(settings.method, n, settings.budget_m), seed=rng,
                      **settings.params)
    phi = scale_phi(result.values, result.v_grand - result.v_empty, settings.phi_scale)
    return RoundValuation(phi, result.values, _weights(settings, phi, r.num_examples),
                          int(result.n_evals), 0.0, result.v_empty, result.v_grand)


@dataclass(frozen=True)
class RoundValuer:
    """One valuation method of a round: how it values, and what it needs and gives."""

    value: Callable[[RoundInputs, UtilityFactory | None, np.random.Generator], RoundValuation]
    computes_phi: bool  # False: neither the bandit nor phi-weighted aggregation can use it
    uses_game: bool  # values coalitions: needs a utility, takes valuation-params and a budget


_GAME = RoundValuer(_game, computes_phi=True, uses_game=True)
#: Every valuation method the strategy accepts, in one table: the game estimators, ShapFed-WA,
#: ``none`` (FedAvg) and ``multikrum`` (Flower's Multi-Krum selection, then FedAvg over the kept
#: updates; a robustness baseline whose "phi" is its 0/1 keep mask).
ROUND_VALUERS: Mapping[str, RoundValuer] = MappingProxyType({
    **dict.fromkeys(ESTIMATORS, _GAME),
    "shapfed-wa": RoundValuer(_shapfed, computes_phi=True, uses_game=False),
    "none": RoundValuer(_fedavg, computes_phi=False, uses_game=False),
    "multikrum": RoundValuer(_multikrum, computes_phi=False, uses_game=False),
})
METHODS: tuple[str, ...] = tuple(ROUND_VALUERS)
#: Methods that compute no contributions phi.
NO_PHI: tuple[str, ...] = tuple(m for m, v in ROUND_VALUERS.items() if not v.computes_phi)
#: Methods that value coalitions of updates (need a utility factory, take valuation-params).
GAME_METHODS: tuple[str, ...] = tuple(m for m, v in ROUND_VALUERS.items() if v.uses_game)
