"""One round's valuation: contributions phi, their scale, and the aggregation weights.

The utility of a coalition S is supplied by the caller (the ServerApp builds a batched torch
utility over its evaluation set); this module holds the settings, what ``auto`` means, and
:func:`value_round`, which runs the configured valuer of
:data:`fedowen_strategy.round.round_valuers.ROUND_VALUERS` (the one table of methods, their budget,
and the scale of phi and weights they give).

The round's end points ``nu(empty)`` and ``nu(N)`` are those of the estimate, evaluated within
the budget of N x M utility calls.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.bounds import AUTO_NORM_CAP, NORM_CAPS
from fedowen_strategy.defences.links import quotient, split_among
from fedowen_strategy.round.aggregation import AGGREGATIONS, NEEDS_PHI
from fedowen_strategy.round.round_valuers import (
    GAME_METHODS,
    METHODS,
    NO_PHI,
    ROUND_VALUERS,
    RoundInputs,
    RoundValuation,
    UtilityFactory,
)
from fedowen_strategy.selectors import registry
from fedowen_strategy.selectors.shared import AUTO_CAP
from fedowen_strategy.settings import NO_KEYS, Keys, Settings, key, one_of
from fedowen_strategy.valuation import ESTIMATORS
from fedowen_task import declare

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

    method: str = declare.key(
        "owen-antithetic", "FedOwen's valuation method (none: no valuation; multikrum: Flower's "
        "MultiKrum)", name="valuation")
    budget_m: int = declare.key(4, "utility calls a round per returned update", name="budget-m")
    params: Mapping[str, Any] = field(default_factory=dict,
                                      metadata=declare.named("valuation-params"))
    phi_scale: str = declare.key("l1", "phi's scale: l1 | normalised | raw", name="phi-scale")
    temperature: float = declare.key(
        1.0, "softmax(phi / T)'s T (softmax-spread: T as a multiple of the round's phi "
        "standard deviation)", name="temperature")
    krum_malicious: int = declare.key(
        0, "adversaries a round (Krum, MultiKrum)", name="krum-malicious")
    aggregation: str = declare.key(
        "auto", "softmax | positive | softmax-spread | examples | uniform; auto: the "
        "valuation's own", name="aggregation")
    game: str = declare.key("delta", "the coalition game: delta | average", name="game")
    uniform_mix: float = declare.key(
        0.0, "weights mixed with equal weights by this share", name="uniform-mix")
    weight_cap: float = declare.key(
        1.0, "no client's weight above this (1: off)", name="weight-cap")

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
class Choices:
    """The selection, aggregation, norm cap and identity cap a run uses, ``auto`` resolved."""

    selection: str
    aggregation: str
    norm_cap: str
    cap: float = 0.0


def resolve_auto(method: str, selection: str = "auto", aggregation: str = "auto",
                 norm_cap: str = "auto", cap: float = AUTO_CAP) -> Choices:
    """What ``auto`` means for valuation ``method``, the one place it is decided: FedOwen's
    choices (``adaptive`` selection, Algorithm 2, ``softmax`` aggregation, the norm cap
    :data:`~fedowen_strategy.defences.bounds.AUTO_NORM_CAP`) for a method that computes
    contributions,
    FedAvg's (``random``, ``examples``, no norm cap) for the methods in :data:`NO_PHI` (the
    selectors: :data:`~fedowen_strategy.selectors.registry.AUTO_WITH_PHI` and
    ``AUTO_WITHOUT_PHI``); the identity cap :data:`~fedowen_strategy.selectors.shared.AUTO_CAP`
    is the resolved selector's own (:func:`~fedowen_strategy.selectors.registry.resolve_cap`);
    other values are kept.

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
    auto = (Choices(registry.AUTO_WITHOUT_PHI, "examples", "none") if no_phi
            else Choices(registry.AUTO_WITH_PHI, "softmax", AUTO_NORM_CAP))
    chosen = auto.selection if selection == "auto" else selection
    return Choices(chosen, auto.aggregation if aggregation == "auto" else aggregation,
                   auto.norm_cap if norm_cap == "auto" else norm_cap,
                   registry.resolve_cap(chosen, cap))


def selection_problems(method: str, selection: str, keys: Keys = NO_KEYS) -> list[str]:
    """What is wrong with ``selection`` (``auto`` or a name in
    :data:`~fedowen_strategy.selectors.registry.SELECTORS`) for valuation ``method``."""
    found = one_of("selection", selection, ("auto", *registry.SELECTORS))
    spec = registry.SELECTORS.get(selection)
    if method in NO_PHI and spec is not None and spec.needs_phi:
        names = [repr(n) for n, s in registry.SELECTORS.items() if not s.needs_phi]
        others = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        found.append(f"selection={selection!r} ranks clients by phi, which "
                     f"{key(keys, 'method')}={method!r} does not compute: use "
                     f"selection={others} (or 'auto')")
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
    :func:`fedowen_strategy.defences.links.duplicate_groups`, or near-parallel updates,
    :func:`fedowen_strategy.defences.links.link_groups`). Each group plays the game as one player
    (:func:`fedowen_strategy.defences.links.quotient`: its members' mean update), and that player's
    phi and weight are split equally among the members, so k copies together earn, and
    weigh, what one would. Without groups every update is its own player.
    """
    start = time.perf_counter()
    if not states:
        raise ValueError("value_round needs at least one returned update")
    valuer = ROUND_VALUERS[settings.method]
    if groups:
        players, states, num_examples = quotient(states, num_examples, groups)
    val = valuer.value(RoundInputs(states, num_examples, global_state, settings),
                       utility_factory, seed)
    if groups:
        val = _expand(val, players)
    return dataclasses.replace(val, seconds=time.perf_counter() - start)
