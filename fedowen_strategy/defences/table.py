"""The defences' one table, ``DEFENCES``, and the ordered lists a run applies.

A row names a defence (its name in the run config's ``defences``), the class that runs it
(a :class:`~fedowen_strategy.defences.base.Guard`), the run-config keys it reads and a line of
help. Adding a defence is one module and one row (docs/defences.md); nothing else in the
library names one. Read the table through this module (``table.DEFENCES``) so that a row added
at run time is seen.

``defences = "auto"`` (the default) is :data:`FEDOWEN_DEFENCES` for FedOwen and
:data:`FLOWER_DEFENCES` around Flower's strategies and the peers: what each did before the
defences were a list (issue 72). Each step acts as its own keys say (most are off by
default), so the old keys keep their meaning; the list orders the steps, drops one, or adds
one the table holds. The peers' filters (``alignins``, ``multi-metrics``, ``indicator``) and
FLAME whole (``flame``) are rows in no ``auto`` list: a run adds them by name. ``indicator``
needs its task (the out-of-distribution samples and the model to plant them in): the row makes
the guard without one, and the ServerApp puts a bound guard in its place
(``server_app.indicator``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from fedowen_strategy.defences.alignins import AlignIns
from fedowen_strategy.defences.base import Guard
from fedowen_strategy.defences.flame import Flame
from fedowen_strategy.defences.guard_settings import Defence, Guards
from fedowen_strategy.defences.identity import Identity
from fedowen_strategy.defences.indicator import Indicator
from fedowen_strategy.defences.multi_metrics import MultiMetrics
from fedowen_strategy.defences.noise import AggregateNoise
from fedowen_strategy.defences.norm_cap import NormCap
from fedowen_strategy.defences.norm_ratio import NormRatio
from fedowen_strategy.defences.robust_lr import RobustLR
from fedowen_strategy.defences.statistics_cap import StatisticsCap
from fedowen_strategy.defences.statistics_rule import StatisticsRule
from fedowen_strategy.defences.sybil_links import Links
from fedowen_strategy.defences.update_bound import UpdateBound
from fedowen_strategy.defences.update_filter import UpdateFilter
from fedowen_strategy.defences.value_cap import ValueCap


@dataclass(frozen=True)
class DefenceSpec:
    """A registered defence: ``make()`` returns its :class:`~fedowen_strategy.defences.base.
    Guard`; ``keys`` are the run-config keys it reads (empty: none); ``help`` one line for the
    docs."""

    name: str
    make: Callable[[], Guard]
    keys: tuple[str, ...]
    help: str


DEFENCES = MappingProxyType({spec.name: spec for spec in (
    DefenceSpec("identity", Identity, (), "refuse a reply that speaks for another node's "
                "client id"),
    DefenceSpec("norm-ratio", NormRatio, ("max-norm-ratio",),
                "reject updates beyond this x the global model's norm"),
    DefenceSpec("update-bound", UpdateBound, ("update-bound", "update-bound-multiple"),
                "clip or reject updates beyond x the median norm per example"),
    DefenceSpec("update-filter", UpdateFilter, ("update-filter",),
                "keep the majority cluster of directions, or the server step's side"),
    DefenceSpec("norm-cap", NormCap, ("norm-cap", "norm-cap-multiple"),
                "rescale updates to at most x a reference norm"),
    DefenceSpec("statistics-cap", StatisticsCap, ("statistics-cap",),
                "cap each update's BatchNorm statistics' deviation"),
    DefenceSpec("value-cap", ValueCap, ("value-cap-multiple", "value-cap-mode"),
                "value updates at x the norm cap's reference"),
    DefenceSpec("links", Links, ("duplicate-tolerance", "link-cosine"),
                "copies and near-parallel updates play as one"),
    DefenceSpec("statistics-rule", StatisticsRule, ("statistics-rule",),
                "the aggregate's BatchNorm statistics: their weighted median"),
    DefenceSpec("robust-lr", RobustLR, ("robust-lr-threshold",),
                "reverse the step where too few updates agree on its sign"),
    DefenceSpec("aggregate-noise", AggregateNoise, ("aggregate-noise",),
                "Gaussian noise on the aggregate, x the median norm"),
    DefenceSpec("alignins", AlignIns, ("alignins-sparsity", "alignins-lambda-s",
                                        "alignins-lambda-c"),
                "AlignIns: keep updates aligned in direction and sign, clip to their median norm"),
    DefenceSpec("multi-metrics", MultiMetrics, ("multi-metrics-keep",),
                "MultiMetrics: keep the lowest whitened cosine, Manhattan and length scores"),
    DefenceSpec("flame", Flame, ("flame-lambda",),
                "FLAME: the majority cluster of directions, clipped to the median norm, noise"),
    DefenceSpec("indicator", Indicator, ("indicator-threshold", "indicator-epochs",
                                          "indicator-lr", "indicator-mu"),
                "BackdoorIndicator: plant OOD samples in the model sent, reject updates that "
                "keep them"),
)})
#: FedOwen's list under ``defences = "auto"``: every guard it applied before issue 72, in the
#: order it applied them.
FEDOWEN_DEFENCES = ("identity", "norm-ratio", "update-bound", "update-filter", "norm-cap",
                    "statistics-cap", "value-cap", "links", "statistics-rule", "robust-lr",
                    "aggregate-noise")
#: Flower's strategies' and the peers' list under ``auto``: the statistics cap and rule, the
#: one guard the ServerApp applied around them before issue 72.
FLOWER_DEFENCES = ("statistics-cap", "statistics-rule")
AUTO = "auto"


def names(text: str) -> list[str]:
    """The defence names of a ``defences`` value: names separated by commas or spaces, or
    ``auto`` alone (kept as ``["auto"]``; :func:`resolve` reads it)."""
    return [name for name in re.split(r"[\s,]+", text.strip()) if name]


def problems(text: str, key: str = "defences") -> list[str]:
    """What is wrong with a ``defences`` value, one problem per unknown or repeated name."""
    found = names(text)
    if found == [AUTO]:
        return []
    if not found:
        return [f"{key}={text!r} names no defence: set it to \"auto\" (the strategy's own "
                f"list) or to names of {', '.join(DEFENCES)} (an empty list: \"none\")"]
    if found == ["none"]:
        return []
    bad = [alone(word, found, key) for word in found if word in (AUTO, "none")][:1]
    for name in found:
        if name in (AUTO, "none"):
            continue
        if name not in DEFENCES:
            close = difflib.get_close_matches(name, [*DEFENCES, AUTO], n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            bad.append(f"{key}: {name!r} is not a defence{hint}; the table has "
                       f"{', '.join(DEFENCES)} (docs/defences.md)")
    bad += [f"{key}: {name!r} is listed twice; each defence acts once a round"
            for name in dict.fromkeys(n for n in found if found.count(n) > 1)]
    return bad


def alone(word: str, found: Sequence[str], key: str = "defences") -> str:
    """The problem of ``auto`` or ``none`` listed with other names: the list a user most likely
    means, FedOwen's ``auto`` list with the other names as screens before ``norm-cap``."""
    extra = [n for n in found if n in DEFENCES and n not in FEDOWEN_DEFENCES]
    at = FEDOWEN_DEFENCES.index("norm-cap")
    meant = [*FEDOWEN_DEFENCES[:at], *extra, *FEDOWEN_DEFENCES[at:]]
    return (f"{key}: {word!r} stands alone (the strategy's own list, or no defence); to add "
            f"{', '.join(map(repr, extra)) or 'a defence'} to FedOwen's, list every name, e.g. "
            f"{key} = \"{' '.join(meant)}\" (around a Flower strategy its auto list is "
            f"{' '.join(FLOWER_DEFENCES)}; docs/defences.md)")


def resolve(text: str | Sequence[str], fedowen: bool) -> tuple[str, ...]:
    """The names a run applies: ``auto`` resolved for FedOwen (``fedowen``) or a Flower
    strategy, ``none`` as no defence, else the names as listed.

    Raises
    ------
    ValueError
        When a name is not in the table or is listed twice (:func:`problems`).
    """
    listed = names(text) if isinstance(text, str) else list(text)
    if listed == [AUTO]:
        return FEDOWEN_DEFENCES if fedowen else FLOWER_DEFENCES
    if listed == ["none"]:
        return ()
    if found := problems(" ".join(listed)):
        raise ValueError("; ".join(found))
    return tuple(listed)


def build(defences: str | Sequence[str | Guard], fedowen: bool) -> list[Guard]:
    """The run's guards, in order: names resolved (:func:`resolve`: ``auto``, ``none``, the
    table's rows) and made from their rows; a :class:`~fedowen_strategy.defences.base.Guard`
    in the list is used as it is (a defence the table does not hold)."""
    if isinstance(defences, str) or all(isinstance(d, str) for d in defences):
        listed = [d for d in ([defences] if isinstance(defences, str) else defences)
                  if isinstance(d, str)]
        return [DEFENCES[name].make() for name in resolve(" ".join(listed), fedowen)]
    named = " ".join(d for d in defences if isinstance(d, str))
    if found := problems(named) if named else []:
        raise ValueError("; ".join(found))
    return [DEFENCES[d].make() if isinstance(d, str) else d for d in defences]


def in_force(guards: Guards, norm_cap: str, defences: Sequence[Guard]) -> Defence:
    """The bounds an update faces under ``defences``: ``guards`` and the resolved ``norm_cap``
    with the norm ratio, the update bound and the norm cap off where their steps are not
    listed (what :func:`fedowen_strategy.defences.guards.bound_in_force` reads for the
    adaptive attacker)."""
    listed = {d.name for d in defences}
    return (replace(guards,
                    max_norm_ratio=guards.max_norm_ratio if "norm-ratio" in listed else 0.0,
                    update_bound=guards.update_bound if "update-bound" in listed else "none"),
            norm_cap if "norm-cap" in listed else "none")
