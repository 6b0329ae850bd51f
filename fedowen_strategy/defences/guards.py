"""What FedOwen does to a round's updates before it values them: the screen steps of its
defence list, and the bound an update must stay under to pass them unchanged.

:func:`guard_round` runs the screen steps (:meth:`~fedowen_strategy.defences.base.Guard.
screen`) of a defence list (default: FedOwen's, :data:`~fedowen_strategy.defences.table.
FEDOWEN_DEFENCES`) over one round, under the guards' settings
(:class:`~fedowen_strategy.defences.guard_settings.Guards`, with the app's defaults: the
run-config keys of the same names); a pure function of the round's updates and the global
model. In FedOwen's default order:

1. ``norm-ratio``: updates farther from the global model than ``max-norm-ratio`` x its norm
   are rejected (:mod:`fedowen_strategy.defences.norm_ratio`);
2. ``update-bound`` (off by default): clip or reject updates far above the round's median norm
   per example (:mod:`fedowen_strategy.defences.update_bound`);
3. ``update-filter`` (off by default): the majority or server-direction filter
   (:mod:`fedowen_strategy.defences.update_filter`);
4. ``norm-cap`` (``auto``: the round's lower-median norm x 2 for a valuation method, nothing
   for the FedAvg baselines): every update rescaled to at most the cap
   (:mod:`fedowen_strategy.defences.norm_cap`);
5. ``statistics-cap`` (off by default) bounds the BatchNorm statistics no other guard reads
   (:mod:`fedowen_strategy.defences.statistics_cap`; the default ``statistics-rule``, their
   weighted median, is a settle step: it acts when the round averages);
6. ``value-cap`` (``value-cap-multiple``, on by default): the updates are valued at a tighter
   cap of the norm cap's reference than they are averaged at
   (:mod:`fedowen_strategy.defences.value_cap`);
7. ``links``: exact copies (``duplicate-tolerance``; their ids are banned by the strategy)
   merged with near-parallel updates (``link-cosine``), each group one player of the game
   (:mod:`fedowen_strategy.defences.sybil_links`).

The round is put in client-id order before the first step
(:func:`~fedowen_strategy.defences.base.screen_round`).

:func:`bound_in_force` says how large an update may be and pass all of them unchanged, from
the same functions the guards apply (:func:`~fedowen_strategy.replies.norm_ratio_limit`,
:func:`~fedowen_strategy.defences.bounds.example_bound`, :func:`cap_reference`,
:func:`norm_cap_at`): whoever needs the defence's bound (the adaptive attacker of
``server_app.byzantine``) asks it, so a changed guard never leaves a stale copy behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from numpy.typing import NDArray

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView, screen_round
from fedowen_strategy.defences.bounds import example_bound, lower_median
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.norm_cap import Median, cap_reference, norm_cap_at
from fedowen_strategy.defences.sybil_links import RECORD_COSINES_UP_TO
from fedowen_strategy.defences.table import build
from fedowen_strategy.replies import ClientUpdate, norm_ratio_limit

__all__ = ["RECORD_COSINES_UP_TO", "GuardedRound", "Median", "bound_in_force",
           "cap_reference", "guard_round", "norm_cap_at"]


def bound_in_force(guards: Guards, norm_cap: str, *, norms: Sequence[float],
                   examples: Sequence[int], own_examples: int, global_norm: float,
                   server_norm: float | None = None, median: Median = lower_median
                   ) -> float | None:
    """The largest norm an update of ``own_examples`` examples may have and pass every guard
    unchanged; None when no guard bounds it.

    The tightest of ``max-norm-ratio`` x ``global_norm``, the update bound (``update-bound``:
    :func:`~fedowen_strategy.defences.bounds.example_bound` of the round's update ``norms`` and
    ``examples``, x ``own_examples``) and the norm cap (:func:`norm_cap_at` the
    :func:`cap_reference` of ``norm_cap``, resolved, with the server step's ``server_norm``).
    ``median``: the statistic the cap reads of ``norms``; an attacker whose own updates move
    the median passes the one it will face. The guards apply the update bound before they
    measure the median, and this reads both from the same ``norms``: an estimate when the
    update bound clips.
    """
    limits = [norm_ratio_limit(guards.max_norm_ratio, global_norm)]
    if guards.update_bound != "none" and own_examples > 0:
        per_example = example_bound(norms, examples, guards.update_bound_multiple)
        limits.append(None if per_example is None else per_example * own_examples)
    limits.append(norm_cap_at(guards, cap_reference(norm_cap, norms, server_norm, median)))
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def guard_round(updates: Sequence[ClientUpdate], global_state: Mapping[str, NDArray],
                guards: Guards, *, norm_cap: str, value_players: bool, server_round: int = 0,
                server_update: Callable[[], Mapping[str, NDArray]] | None = None,
                defences: Sequence[Guard] | None = None) -> GuardedRound:
    """Apply the screen steps of ``defences`` (default: FedOwen's list) to one round.

    Parameters
    ----------
    norm_cap : str
        The resolved norm cap (:func:`fedowen_strategy.round.contribution.resolve_auto`).
    value_players : bool
        Whether the method values players (near-parallel updates are linked only then).
    server_round : int
        For the log lines.
    server_update : callable, optional
        One server step's state, the reference of ``norm_cap = "server"``.
    defences : sequence of Guard, optional
        The run's defence list (:func:`fedowen_strategy.defences.table.build`).
    """
    view = RoundView(global_state, guards, norm_cap, value_players, server_round, server_update)
    return screen_round(build("auto", fedowen=True) if defences is None else defences,
                        updates, view)
