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
from fedowen_strategy.selection import NEEDS_PHI_SELECTIONS, SELECTIONS
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
class ValuationSettings:
    """How a round is valued and aggregated (defaults: the app's; see the module docstring
    for ``phi_scale``); ``aggregation = "auto"`` resolves as in :func:`resolve_axes`."""

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
        mix_and_cap(np.ones(1), self.uniform_mix, self.weight_cap)  # validates both
        if self.game not in GAMES:
            raise ValueError(f"game={self.game!r} is not one of {GAMES}")
        if self.method not in METHODS:
            raise ValueError(f"valuation={self.method!r} is not one of {', '.join(METHODS)}")
        spec = ESTIMATORS.get(self.method)
        if spec is not None and spec.uses_first_order and self.game != "delta":
            raise ValueError(f"valuation={self.method!r} uses the delta game's first-order "
                             f"terms: set game='delta' (got {self.game!r})")
        _, aggregation = resolve_axes(self.method, "random", self.aggregation)
        object.__setattr__(self, "aggregation", aggregation)
        if self.budget_m < 1:
            raise ValueError(f"budget M={self.budget_m!r} must be >= 1 (paper: 4)")
        if self.phi_scale not in PHI_SCALES:
            raise ValueError(f"phi-scale={self.phi_scale!r} is not one of {PHI_SCALES}")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r} must be > 0 (paper: 1)")

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


def resolve_axes(method: str, selection: str, aggregation: str) -> tuple[str, str]:
    """The (selection, aggregation) a run uses; ``auto`` picks FedOwen's choices (``adaptive``,
    ``softmax``) for a valuation method and FedAvg's (``random``, ``examples``) for the methods
    in NO_PHI.

    Raises
    ------
    ValueError
        For a value outside its choices, or a combination that needs contributions from a
        method that computes none (e.g. ``valuation = "none"`` with ``softmax``).
    """
    no_phi = method in NO_PHI
    if selection == "auto":
        selection = "random" if no_phi else "adaptive"
    if aggregation == "auto":
        aggregation = "examples" if no_phi else "softmax"
    problems = []
    if selection not in SELECTIONS:
        problems.append(f"selection={selection!r} is not one of auto, {', '.join(SELECTIONS)}")
    if aggregation not in AGGREGATIONS:
        problems.append(f"aggregation={aggregation!r} is not one of auto, "
                        f"{', '.join(AGGREGATIONS)}")
    if no_phi and selection in NEEDS_PHI_SELECTIONS:
        problems.append(f"selection={selection!r} ranks clients by phi, which valuation="
                        f"{method!r} does not compute: use selection='random', "
                        "'power-of-choice' or 'oort' (or 'auto')")
    if no_phi and aggregation in NEEDS_PHI:
        problems.append(f"aggregation={aggregation!r} weights by phi, which valuation="
                        f"{method!r} does not compute: use 'examples' or 'uniform' (or 'auto')")
    if problems:
        raise ValueError("; ".join(problems))
    return selection, aggregation


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


def quotient(states: Sequence[Mapping[str, NDArray]], num_examples: Sequence[int],
             groups: Sequence[Sequence[int]]
             ) -> tuple[list[list[int]], list[dict[str, NDArray]], list[int]]:
    """The quotient game's players: each group of linked updates becomes one player whose
    state is its members' mean and whose example count is their mean (k copies count as one);
    the others stay as they are. Players are ordered by their first member."""
    grouped = {i for g in groups for i in g}
    players = sorted([sorted(g) for g in groups] + [[i] for i in range(len(states))
                                                    if i not in grouped])
    merged = [dict(states[p[0]]) if len(p) == 1 else
              {key: np.mean([np.asarray(states[i][key], np.float64) for i in p], axis=0)
               .astype(np.asarray(states[p[0]][key]).dtype) for key in states[p[0]]}
              for p in players]
    examples = [round(float(np.mean([num_examples[i] for i in p]))) for p in players]
    return players, merged, examples


def _expand(val: RoundValuation, players: Sequence[Sequence[int]], n: int) -> RoundValuation:
    """Split each player's phi and weight equally among its members."""
    phi, phi_raw, weights = np.zeros(n), np.zeros(n), np.zeros(n)
    for q, members in enumerate(players):
        idx, k = list(members), len(members)
        phi[idx], phi_raw[idx], weights[idx] = (val.phi[q] / k, val.phi_raw[q] / k,
                                                val.weights[q] / k)
    return dataclasses.replace(val, phi=phi, phi_raw=phi_raw, weights=weights)


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
    (:func:`quotient`: its members' mean update), and that player's phi and weight are split
    equally among the members, so k copies together earn, and weigh, what one would. Without
    groups every update is its own player.
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
        val = _expand(val, players, sum(len(p) for p in players))
    return dataclasses.replace(val, seconds=time.perf_counter() - start)
