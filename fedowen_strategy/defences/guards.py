"""What FedOwen does to a round's updates before it values them: bound, cap, group.

:func:`guard_round` applies the guards' settings
(:class:`~fedowen_strategy.defences.guard_settings.Guards`, with the app's defaults: the
run-config keys of the same names) to one round, a pure function of the round's updates and
the global model:

1. ``update-bound`` (off by default): clip or reject updates far above the round's median norm
   per example (:mod:`fedowen_strategy.defences.bounds`);
2. ``norm-cap`` (``auto``: the round's lower-median norm x 2 for a valuation method, nothing
   for the FedAvg baselines): every update rescaled to at most the cap
   (:func:`fedowen_strategy.defences.bounds.cap_norms`); with ``value-cap-multiple`` (off by
   default) the updates are valued at a tighter cap of the same reference than they are
   averaged at (``value-cap-mode``: at most that norm, or every update at exactly it);
   ``statistics-cap`` (off by default) bounds the BatchNorm statistics no other guard reads
   (:mod:`fedowen_strategy.defences.statistics`; the default ``statistics-rule``, their
   weighted median, acts when the round averages, :mod:`fedowen_strategy.round.round_step`);
3. groups: exact copies (``duplicate-tolerance``; their ids are banned by the strategy) merged
   with near-parallel updates (``link-cosine``), each group one player of the game
   (:mod:`fedowen_strategy.defences.links`).

``max-norm-ratio`` (updates farther from the global model than that multiple of its norm are
rejected) acts earlier, when the replies are parsed (:func:`fedowen_strategy.replies.
parse_replies`); its key is a field of ``Guards`` because it is a guard of the same kind.

:func:`bound_in_force` says how large an update may be and pass all of them unchanged, from
the same functions the guards apply (:func:`~fedowen_strategy.replies.norm_ratio_limit`,
:func:`~fedowen_strategy.defences.bounds.example_bound`, :func:`cap_reference`,
:func:`norm_cap_at`): whoever needs the defence's bound (the adaptive attacker of
``server_app.byzantine``) asks it, so a changed guard never leaves a stale copy behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numpy.typing import NDArray

from fedowen_strategy.defences.bounds import (
    bound_updates,
    cap_norms,
    example_bound,
    lower_median,
    norms_of,
)
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.links import (
    duplicate_groups,
    link_groups,
    merge_groups,
    upper_triangle,
)
from fedowen_strategy.defences.majority import filter_majority
from fedowen_strategy.defences.server_direction import filter_server_direction
from fedowen_strategy.defences.statistics import cap_statistics
from fedowen_strategy.nodes import client_order
from fedowen_strategy.replies import ClientUpdate, norm_ratio_limit
from fedowen_strategy.updates import cosine_matrix, update_norm

log = logging.getLogger(__name__)

#: Rounds of at most this many updates record their pairwise cosines.
RECORD_COSINES_UP_TO = 32
#: The statistic the median norm cap reads of a round's update norms (the lower median).
Median = Callable[[Sequence[float]], float | None]


def cap_reference(norm_cap: str, norms: Sequence[float], server_norm: float | None = None,
                  median: Median = lower_median) -> float | None:
    """The norm the norm cap is a multiple of: under ``server`` the server step's norm (when a
    step was taken), else ``median`` of the round's update ``norms``; None under ``none``.
    ``norm_cap`` is resolved (:func:`~fedowen_strategy.round.contribution.resolve_auto`)."""
    if norm_cap == "none":
        return None
    if norm_cap == "server" and server_norm is not None:
        return server_norm
    return median(norms)


def norm_cap_at(guards: Guards, reference: float | None) -> float | None:
    """The norm cap at a reference norm: ``norm_cap_multiple`` x it; None without a reference
    (or a zero one: nothing moved, nothing to cap)."""
    return None if not reference else guards.norm_cap_multiple * reference


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


@dataclass
class GuardedRound:
    """A round's updates after the guards (in client-id order), and what the guards did.

    ``groups`` index ``updates``: each is one player of the game. ``valued`` (with
    ``value_cap_multiple``) holds the states to value, aligned with ``updates``; empty: value
    ``updates`` themselves. ``copies`` are the client ids of exact copies (to ban), ``links``
    those of near-parallel groups (the strategy's bandit reads them here). ``record`` holds the
    round record's fields: ``norm_cap`` and ``capped`` (when a cap applied), ``value_cap`` and
    ``value_capped`` (the valuation's cap, when set), ``statistics_cap`` and
    ``statistics_capped`` (``statistics-cap``, when on and the model's statistics moved),
    ``cosines`` (rounds of at most :data:`RECORD_COSINES_UP_TO` updates) and ``links`` (a copy
    of the field, when any).
    """

    updates: list[ClientUpdate]
    rejected: dict[str, str] = field(default_factory=dict)
    clipped: dict[str, float] = field(default_factory=dict)
    groups: list[list[int]] = field(default_factory=list)
    valued: list[Mapping[str, NDArray]] = field(default_factory=list)
    copies: list[list[str]] = field(default_factory=list)
    links: list[list[str]] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)


def guard_round(updates: Sequence[ClientUpdate], global_state: Mapping[str, NDArray],
                guards: Guards, *, norm_cap: str, value_players: bool, server_round: int = 0,
                server_update: Callable[[], Mapping[str, NDArray]] | None = None
                ) -> GuardedRound:
    """Apply ``guards`` to one round's updates.

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
    """
    bounded = bound_updates(updates, global_state, guards.update_bound,
                            guards.update_bound_multiple)
    out = GuardedRound(bounded.updates, dict(bounded.rejected), dict(bounded.clipped))
    if guards.update_filter == "majority" and out.updates:
        out.updates, outside = filter_majority(out.updates, global_state)
        out.rejected.update(outside)
    if guards.update_filter == "server-direction" and out.updates:
        if server_update is None:
            raise ValueError("update_filter='server-direction' needs server_update (one "
                             "server training step on the evaluation set)")
        out.updates, against, cosines = filter_server_direction(out.updates, global_state,
                                                                server_update())
        out.rejected.update(against)
        out.record["server_cosines"] = cosines
    reference, norms = _cap(out, global_state, guards, norm_cap, server_update)
    statistics = cap_statistics(out.updates, global_state, guards.statistics_cap)
    if statistics.cap is not None:
        out.updates = statistics.updates
        out.record.update(statistics_cap=statistics.cap, statistics_capped=statistics.capped)
    # valued and averaged in client-id order, so the estimator's sampled orders (and float
    # sums) do not depend on arrival times
    out.updates.sort(key=lambda upd: client_order(upd.client_id))
    if reference and guards.value_cap_multiple > 0 and value_players:
        value_cap = guards.value_cap_multiple * reference
        valued = cap_norms(out.updates, global_state, value_cap,
                           exactly=guards.value_cap_mode == "exactly",
                           norms=[norms[u.client_id] for u in out.updates] if norms else None)
        out.valued = [u.state for u in valued.updates]
        out.record.update(value_cap=value_cap, value_capped=valued.clipped)
    if out.updates:
        out.groups = _groups(out, global_state, guards, value_players, norms)
    if out.copies:
        log.warning("round %d: copies share one weight and are linked (not selected again, no "
                    "payout): %s", server_round, out.copies)
    if out.links:
        log.info("round %d: near-parallel updates play as one (cosine > %g): %s", server_round,
                 guards.link_cosine, out.links)
    return out


def _cap(out: GuardedRound, global_state: Mapping[str, NDArray], guards: Guards, norm_cap: str,
         server_update: Callable[[], Mapping[str, NDArray]] | None
         ) -> tuple[float | None, dict[str, float]]:
    """The norm cap applied to ``out.updates`` (recorded); returns its reference norm and the
    updates' norms after it by client id (empty when no norm was measured), so the value cap
    and the copies screen measure no update twice."""
    if norm_cap == "none" or not out.updates:
        return None, {}
    server_norm = (update_norm(server_update(), global_state)
                   if norm_cap == "server" and server_update is not None else None)
    norms = [] if server_norm is not None else norms_of(out.updates, global_state)
    reference = cap_reference(norm_cap, norms, server_norm)
    cap = norm_cap_at(guards, reference)
    capped = cap_norms(out.updates, global_state, cap, norms=norms or None)
    out.updates = capped.updates
    out.record.update(norm_cap=cap, capped=capped.clipped)
    if not norms:
        return reference, {}
    return reference, {u.client_id: update_norm(u.state, global_state)
                       if u.client_id in capped.clipped else norm
                       for u, norm in zip(capped.updates, norms, strict=True)}


def _groups(out: GuardedRound, global_state: Mapping[str, NDArray], guards: Guards,
            value_players: bool, norms: Mapping[str, float]) -> list[list[int]]:
    """Copies merged with near-parallel updates; fills ``copies``, ``cosines``, ``links``.
    ``norms``: the updates' norms by client id, where the norm cap measured them."""
    states = [u.state for u in out.updates]
    ids = [u.client_id for u in out.updates]
    copies = duplicate_groups(states, global_state, guards.duplicate_tolerance,
                              [norms[c] for c in ids] if norms else None)
    out.copies = [[ids[i] for i in g] for g in copies]
    if not value_players or len(states) < 2:
        return copies
    cosines = cosine_matrix(states, global_state)
    if len(states) <= RECORD_COSINES_UP_TO:  # the honest pairs' distribution (links)
        out.record["cosines"] = upper_triangle(cosines)
    near = link_groups(cosines, guards.link_cosine)
    if near:
        out.links = [[ids[i] for i in g] for g in near]
        out.record["links"] = [list(g) for g in out.links]
    return merge_groups(len(states), copies, near)
