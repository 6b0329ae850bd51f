"""The selectors' one table, ``SELECTORS``, and what the strategy and the run config read of it.

A row names a selector (the run config's ``selection``), the class that runs it and the
settings type that declares its keys, and says whether it ranks clients by phi (then it needs
a valuation method that computes phi) and which identity cap it runs with by default. Adding a
selector is one module and one row (docs/selection.md, "Adding a selector"); nothing else in
the library names one. Read the table through this module (``registry.SELECTORS``) so that a
row added at run time is seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from fedowen_strategy.selectors.adaptive import Adaptive, AdaptiveSettings
from fedowen_strategy.selectors.base import Selector, SelectorSettings
from fedowen_strategy.selectors.delta import Delta, DeltaSettings
from fedowen_strategy.selectors.delta_phi import DeltaPhi, DeltaPhiSettings
from fedowen_strategy.selectors.exclusion import Excluding
from fedowen_strategy.selectors.greedyfed import GreedyFed, GreedyFedSettings
from fedowen_strategy.selectors.hics import Hics, HicsSettings
from fedowen_strategy.selectors.hics_phi import HicsPhi, HicsPhiSettings
from fedowen_strategy.selectors.oort import Oort, OortSettings
from fedowen_strategy.selectors.posterior import Posterior, PosteriorSettings
from fedowen_strategy.selectors.power_of_choice import PowerOfChoice, PowerOfChoiceSettings
from fedowen_strategy.selectors.random import Random, RandomSettings
from fedowen_strategy.selectors.screened import Screened, ScreenedSettings
from fedowen_strategy.selectors.shared import AUTO_CAP, Selection, SelectionParams


@dataclass(frozen=True)
class SelectorSpec:
    """A registered selector.

    ``make(settings)`` returns a :class:`~fedowen_strategy.selectors.base.Selector` with an
    empty memory; ``settings`` is its :class:`~fedowen_strategy.selectors.base.
    SelectorSettings` type (its run-config keys); ``needs_phi``: it ranks clients by phi, so
    the valuation must compute phi; ``default_cap``: the identity cap it runs with when
    ``selection-cap`` is left at its default (0: off).
    """

    name: str
    make: Callable[[Any], Selector]
    settings: type[SelectorSettings]
    needs_phi: bool = False
    default_cap: float = 0.0


SELECTORS = MappingProxyType({spec.name: spec for spec in (
    SelectorSpec("adaptive", Adaptive, AdaptiveSettings, needs_phi=True),
    SelectorSpec("random", Random, RandomSettings),
    # developed and measured with the cap at 3 (conf/selection-dev.toml); the rest as published
    SelectorSpec("posterior", Posterior, PosteriorSettings, needs_phi=True, default_cap=3.0),
    SelectorSpec("screened", Screened, ScreenedSettings, needs_phi=True),
    SelectorSpec("power-of-choice", PowerOfChoice, PowerOfChoiceSettings),
    SelectorSpec("oort", Oort, OortSettings),
    SelectorSpec("greedyfed", GreedyFed, GreedyFedSettings, needs_phi=True),
    SelectorSpec("delta", Delta, DeltaSettings),
    SelectorSpec("hics-fl", Hics, HicsSettings),
    # FedOwen candidates that learn from the peers (issue 62, deliver 3)
    SelectorSpec("hics-phi", HicsPhi, HicsPhiSettings, needs_phi=True),
    SelectorSpec("delta-phi", DeltaPhi, DeltaPhiSettings, needs_phi=True),
)})
#: What ``selection = "auto"`` means: Algorithm 2 (``adaptive``, the paper's epsilon-greedy
#: bandit) when the valuation computes phi, FedAvg's uniform selection when it does not.
#: ``hics-phi`` was the default from 0ac2020 (selection-peers-dev's fallback) until issue 73: its
#: margin over Algorithm 2 was a tie (+0.30 +- 2.01 paired), and a default changes only when a
#: challenger beats the incumbent beyond the paired CI (docs/experiments.md).
AUTO_WITH_PHI, AUTO_WITHOUT_PHI = "adaptive", "random"
#: The selectors that rank clients by phi (the table's, for callers outside the library).
NEEDS_PHI_SELECTIONS = tuple(name for name, spec in SELECTORS.items() if spec.needs_phi)


def resolve_cap(selection: str, cap: float) -> float:
    """The identity cap ``selection`` runs with: ``cap``, unless it is
    :data:`~fedowen_strategy.selectors.shared.AUTO_CAP`, then the selector's own."""
    return SELECTORS[selection].default_cap if cap == AUTO_CAP else cap


def settings_types() -> list[type[SelectorSettings]]:
    """Every registered selector's settings type, once each, in table order."""
    return list(dict.fromkeys(spec.settings for spec in SELECTORS.values()))


def requested(selection: str | SelectorSettings) -> str:
    """The selector ``selection`` names: a name (or ``auto``) as given, settings by their
    type's :attr:`~fedowen_strategy.selectors.base.SelectorSettings.selector`."""
    return selection if isinstance(selection, str) else type(selection).selector


def selection(name: str, settings: SelectorSettings | None, params: SelectionParams,
              cap: float, rng: np.random.Generator) -> Selection:
    """A run's :class:`~fedowen_strategy.selectors.shared.Selection` with selector ``name``
    (its default settings when ``settings`` is None) behind the identity cap ``cap``
    (resolved) and ``params``' link memory, drawing from ``rng``; with ``params.
    exclusion_level`` the selector is wrapped in
    :class:`~fedowen_strategy.selectors.exclusion.Excluding`."""
    spec = SELECTORS.get(name)
    if spec is None:
        raise ValueError(f"selection={name!r} is not one of {', '.join(SELECTORS)}")
    if settings is None:
        settings = spec.settings()
    if not isinstance(settings, spec.settings):
        raise ValueError(f"selection={name!r} takes {spec.settings.__name__}, got "
                         f"{type(settings).__name__}")
    make: Callable[[Any], Selector] = spec.make
    if params.exclusion_level > 0.0:
        def excluding(settings: Any) -> Selector:
            return Excluding(spec.make(settings), params.exclusion_level,
                             params.exclusion_min_rounds)
        make = excluding
    return Selection(name, make(settings), settings, params, cap, rng, make)
