"""One round's valuation: contributions phi, their scale, and the aggregation weights.

The utility of a coalition S is supplied by the caller (the ServerApp builds a batched torch
utility over its evaluation set); this module decides which valuer runs (one table,
:data:`ROUND_VALUERS`, from which the method lists derive), under which budget, and how its
output becomes weights.

Scale of phi (this module owns it). Estimators return values in the utility's raw units
(accuracy gained): a few hundredths per client, and ``softmax(phi)`` of such numbers is
nearly uniform, so the paper's aggregation would silently be FedAvg. ``phi-scale`` puts them on
a unit scale:

* ``l1`` (default): ``phi / sum|phi|``; ``|phi| <= 1`` always.
* ``normalised``: ``phi / |nu(N) - nu(empty)|``, the scale Algorithm 1 works on; an efficient
  estimator's values then sum to the sign of the round's gain. It equals ``l1`` when all
  contributions share the gain's sign, but when they nearly cancel it inflates them without
  bound and softmax gives one client all the weight: that is why ``l1`` is the default
  (measurements: docs/results/phi-scale-mnist/).
* ``raw``: unchanged.

A scale below :data:`~fedowen_strategy.valuation.FLAT` leaves the values raw (all ~0, so the
softmax weights are uniform).

The round's end points ``nu(empty)`` and ``nu(N)`` are those of the estimate, evaluated within
the budget of N x M utility calls.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.aggregation import (
    AGGREGATIONS,
    NEEDS_PHI,
    mix_and_cap,
    round_weights,
)
from fedowen_strategy.bounds import AUTO_NORM_CAP, NORM_CAPS
from fedowen_strategy.links import quotient, split_among
from fedowen_strategy.selection import (
    AUTO_CAP,
    NEEDS_PHI_SELECTIONS,
    SELECTIONS,
    resolve_cap,
)
from fedowen_strategy.settings import NO_KEYS, Keys, Settings, key, one_of
from fedowen_strategy.shapfed import last_layer_key, shapfed_scores
from fedowen_strategy.valuation import ESTIMATORS, FLAT, estimate

Utility = Callable[[NDArray[np.bool_]], NDArray[np.float64]]
#: ``(global_state, client_states, num_examples[, shares=p]) -> utility``; ``shares`` is passed
#: only for the delta game.
UtilityFactory = Callable[..., Utility]
#: What a coalition utility measures on the evaluation set: accuracy or minus the loss.
UTILITY_METRICS = ("accuracy", "neg-loss")
#: The app's and the library's default (:class:`~fedowen_strategy.torch_utility.
#: CoalitionUtility`): minus the loss ranks updates where accuracy ties (docs/defaults.md).
DEFAULT_UTILITY_METRIC = "neg-loss"
PHI_SCALES = ("normalised", "l1", "raw")
#: The coalition game: ``average`` (a coalition's model is the num-examples average of its
#: members' models) or ``delta`` (``global + sum_{i in S} p_i delta_i``, p = the aggregation's
#: base weights; a client that changed nothing is a null player).
GAMES = ("average", "delta")


@dataclass(frozen=True)
class ValuationSettings(Settings):
    """How a round is valued and aggregated (defaults: the app's; see the module docstring
    for ``phi_scale``); ``aggregation = "auto"`` resolves as :func:`resolve_auto` says."""

    method: str = "owen-antithetic"
    budget_m: int = 4
    params: Mapping[str, Any] = field(default_factory=dict)
    phi_scale: str = "l1"
    temperature: float = 1.0
    krum_malicious: int = 0
    aggregation: str = "auto"
    game: str = "delta"
    uniform_mix: float = 0.0
    weight_cap: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        resolved = resolve_auto(self.method, aggregation=self.aggregation).aggregation
        object.__setattr__(self, "aggregation", resolved)

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings (:class:`~fedowen_strategy.settings.
        Settings`); the estimator's parameters and budget for n players are
        :func:`fedowen_strategy.valuation.estimate_problems`'."""
        k = partial(key, keys)
        checks = [
            (0 <= self.uniform_mix <= 1,
             f"{k('uniform_mix')}={self.uniform_mix!r} must lie in [0, 1]"),
            (0 < self.weight_cap <= 1, f"{k('weight_cap')}={self.weight_cap!r} must lie in (0, 1]"),
            (self.budget_m >= 1, f"{k('budget_m')}={self.budget_m!r} must be >= 1 (paper: 4)"),
            (self.temperature > 0, f"{k('temperature')}={self.temperature!r} must be > 0 "
             "(paper: 1)"),
            (self.krum_malicious >= 0,
             f"{k('krum_malicious')}={self.krum_malicious!r} must be >= 0"),
        ]
        found = [message for ok, message in checks if not ok]
        found += one_of(k("method"), self.method, METHODS)
        found += one_of(k("game"), self.game, GAMES)
        found += one_of(k("phi_scale"), self.phi_scale, PHI_SCALES)
        found += aggregation_problems(self.method, self.aggregation, keys)
        spec = ESTIMATORS.get(self.method)
        if spec is not None and spec.uses_first_order and self.game == "average":
            found.append(f"{k('method')}={self.method!r} uses the first-order terms of the delta "
                         f"game: set {k('game')}='delta' (got {k('game')}={self.game!r})")
        if self.params and self.method in METHODS and self.method not in GAME_METHODS:
            found.append(f"{k('params')}={dict(self.params)!r}: {k('method')}={self.method!r} "
                         "takes no parameters")
        return found

    def check_utility(self, utility_factory: UtilityFactory | None) -> ValuationSettings:
        """These settings, once it is sure a game-based method has a utility to value.

        Raises
        ------
        ValueError
            Naming the ready utility for torch models and the methods that need none.
        """
        if self.method in GAME_METHODS and utility_factory is None:
            raise ValueError(
                f"valuation={self.method!r} values coalitions of updates and needs "
                "utility_factory: pass fedowen_strategy.torch_utility.CoalitionUtility(model, "
                "x_eval, y_eval) or your own, or choose valuation 'shapfed-wa', 'none' or "
                "'multikrum'")
        return self


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


@dataclass(frozen=True)
class Choices:
    """The selection, aggregation, norm cap and identity cap a run uses, ``auto`` resolved."""

    selection: str
    aggregation: str
    norm_cap: str
    cap: float = 0.0


def resolve_auto(method: str, selection: str = "auto", aggregation: str = "auto",
                 norm_cap: str = "auto", cap: float = AUTO_CAP) -> Choices:
    """What ``auto`` means for valuation ``method``, the one place it is decided: FedOwen's
    choices (``adaptive`` selection, ``softmax`` aggregation, the norm cap
    :data:`~fedowen_strategy.bounds.AUTO_NORM_CAP`) for a method that computes contributions,
    FedAvg's (``random``, ``examples``, no norm cap) for the methods in :data:`NO_PHI`; the
    identity cap :data:`~fedowen_strategy.selection.AUTO_CAP` is the resolved selector's own
    (:func:`~fedowen_strategy.selection.resolve_cap`); other values are kept.

    Raises
    ------
    ValueError
        For a value outside its choices, or a combination that needs contributions from a
        method that computes none (e.g. ``method = "none"`` with ``softmax``).
    """
    found = (selection_problems(method, selection) + aggregation_problems(method, aggregation)
             + one_of("norm_cap", norm_cap, NORM_CAPS))
    if found:
        raise ValueError("; ".join(found))
    no_phi = method in NO_PHI
    auto = (Choices("random", "examples", "none") if no_phi
            else Choices("adaptive", "softmax", AUTO_NORM_CAP))
    chosen = auto.selection if selection == "auto" else selection
    return Choices(chosen, auto.aggregation if aggregation == "auto" else aggregation,
                   auto.norm_cap if norm_cap == "auto" else norm_cap, resolve_cap(chosen, cap))


def selection_problems(method: str, selection: str, keys: Keys = NO_KEYS) -> list[str]:
    """What is wrong with ``selection`` (a choice of ``auto`` and :data:`SELECTIONS`) for
    valuation ``method``."""
    found = one_of("selection", selection, ("auto", *SELECTIONS))
    if method in NO_PHI and selection in NEEDS_PHI_SELECTIONS:
        found.append(f"selection={selection!r} ranks clients by phi, which "
                     f"{key(keys, 'method')}={method!r} does not compute: use "
                     "selection='random', 'power-of-choice' or 'oort' (or 'auto')")
    return found


def aggregation_problems(method: str, aggregation: str, keys: Keys = NO_KEYS) -> list[str]:
    """What is wrong with ``aggregation`` (a choice of ``auto`` and :data:`AGGREGATIONS`) for
    valuation ``method``."""
    found = one_of(key(keys, "aggregation"), aggregation, ("auto", *AGGREGATIONS))
    if method in NO_PHI and aggregation in NEEDS_PHI:
        found.append(f"{key(keys, 'aggregation')}={aggregation!r} weights by phi, which "
                     f"{key(keys, 'method')}={method!r} does not compute: use 'examples' or "
                     "'uniform' (or 'auto')")
    return found


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


def _weights(settings: ValuationSettings, phi: NDArray[np.float64],
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
class _Round:
    """What a round valuer sees: the updates, their example counts and the global model."""

    states: Sequence[Mapping[str, NDArray]]
    num_examples: Sequence[int]
    global_state: Mapping[str, NDArray]
    settings: ValuationSettings


def _fedavg(r: _Round, factory: UtilityFactory | None, rng: np.random.Generator
            ) -> RoundValuation:
    zeros = np.zeros(len(r.states))
    weights = round_weights(r.settings.aggregation, zeros, r.num_examples)
    return RoundValuation(zeros, zeros, weights, 0, 0.0)


def _multikrum(r: _Round, factory: UtilityFactory | None, rng: np.random.Generator
               ) -> RoundValuation:
    kept = multikrum_keep(r.states, r.settings.krum_malicious)
    base = round_weights(r.settings.aggregation, kept.astype(np.float64), r.num_examples)
    weights = np.where(kept, base, 0.0)
    return RoundValuation(kept.astype(np.float64), kept.astype(np.float64),
                          weights / weights.sum(), 0, 0.0)


def _shapfed(r: _Round, factory: UtilityFactory | None, rng: np.random.Generator
             ) -> RoundValuation:
    key = last_layer_key(r.global_state)
    phi = shapfed_scores([s[key] for s in r.states], r.global_state[key])
    return RoundValuation(phi, phi, _weights(r.settings, phi, r.num_examples), 0, 0.0)


def _game(r: _Round, factory: UtilityFactory | None, rng: np.random.Generator
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

    value: Callable[[_Round, UtilityFactory | None, np.random.Generator], RoundValuation]
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


def _expand(val: RoundValuation, players: Sequence[Sequence[int]]) -> RoundValuation:
    """Split each player's phi and weight equally among its members."""
    return dataclasses.replace(val, phi=split_among(val.phi, players),
                               phi_raw=split_among(val.phi_raw, players),
                               weights=split_among(val.weights, players))


def value_round(
    states: Sequence[Mapping[str, NDArray]],
    num_examples: Sequence[int],
    global_state: Mapping[str, NDArray],
    settings: ValuationSettings,
    utility_factory: UtilityFactory | None,
    seed: np.random.Generator,
    groups: Sequence[Sequence[int]] = (),
) -> RoundValuation:
    """Value the ``states`` returned this round and turn the values into weights.

    ``groups``: disjoint groups of indices of linked updates (copies,
    :func:`fedowen_strategy.aggregation.duplicate_groups`, or near-parallel updates,
    :func:`fedowen_strategy.links.link_groups`). Each group plays the game as one player
    (:func:`fedowen_strategy.links.quotient`: its members' mean update), and that player's
    phi and weight are split equally among the members, so k copies together earn, and
    weigh, what one would. Without groups every update is its own player.
    """
    start = time.perf_counter()
    if not states:
        raise ValueError("value_round needs at least one returned update")
    valuer = ROUND_VALUERS[settings.method]
    if groups:
        players, states, num_examples = quotient(states, num_examples, groups)
    val = valuer.value(_Round(states, num_examples, global_state, settings),
                       utility_factory, seed)
    if groups:
        val = _expand(val, players)
    return dataclasses.replace(val, seconds=time.perf_counter() - start)
