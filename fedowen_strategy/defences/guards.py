"""What FedOwen does to a round's updates before it values them: bound, cap, group.

:class:`Guards` holds the settings, with the app's defaults (the run-config keys of the same
names); :func:`guard_round` applies them to one round, a pure function of the round's updates
and the global model:

1. ``update-bound`` (off by default): clip or reject updates far above the round's median norm
   per example (:mod:`fedowen_strategy.defences.bounds`);
2. ``norm-cap`` (``auto``: the round's lower-median norm x 2 for a valuation method, nothing
   for the FedAvg baselines): every update rescaled to at most the cap
   (:func:`fedowen_strategy.defences.bounds.cap_norms`); with ``value-cap-multiple`` (off by
   default)
   the updates are valued at a tighter cap of the same reference than they are averaged at
   (``value-cap-mode``: at most that norm, or every update at exactly it);
   ``statistics-cap`` (off by default) bounds the BatchNorm statistics no other guard reads
   (:mod:`fedowen_strategy.defences.statistics`);
3. groups: exact copies (``duplicate-tolerance``; their ids are banned by the strategy) merged
   with near-parallel updates (``link-cosine``), each group one player of the game
   (:mod:`fedowen_strategy.defences.links`).

``max-norm-ratio`` (updates farther from the global model than that multiple of its norm are
rejected) acts earlier, when the replies are parsed (:func:`fedowen_strategy.replies.
parse_replies`); it lives here because it is a guard of the same kind.

:func:`bound_in_force` says how large an update may be and pass all of them unchanged, from
the same functions the guards apply (:func:`~fedowen_strategy.replies.norm_ratio_limit`,
:func:`~fedowen_strategy.defences.bounds.example_bound`, :func:`cap_reference`,
:func:`norm_cap_at`):
whoever needs the defence's bound (the adaptive attacker of ``server_app.byzantine``) asks
it, so a changed guard never leaves a stale copy behind.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from numpy.typing import NDArray

from fedowen_strategy.defences.bounds import (
    NORM_CAPS,
    UPDATE_BOUNDS,
    VALUE_CAP_MODES,
    bound_updates,
    cap_norms,
    example_bound,
    lower_median,
)
from fedowen_strategy.defences.links import (
    duplicate_groups,
    link_groups,
    merge_groups,
    upper_triangle,
)
from fedowen_strategy.defences.majority import UPDATE_FILTERS, filter_majority
from fedowen_strategy.defences.server_direction import filter_server_direction
from fedowen_strategy.defences.statistics import cap_statistics
from fedowen_strategy.nodes import client_order
from fedowen_strategy.replies import ClientUpdate, norm_ratio_limit
from fedowen_strategy.settings import NO_KEYS, Keys, Settings, key, one_of
from fedowen_strategy.updates import cosine_matrix, gram_matrix, update_norm
from fedowen_task import declare

log = logging.getLogger(__name__)

#: Rounds of at most this many updates record their pairwise cosines.
RECORD_COSINES_UP_TO = 32
#: The statistic the median norm cap reads of a round's update norms (the lower median).
Median = Callable[[Sequence[float]], float | None]


@dataclass(frozen=True)
class Guards(Settings):
    """The update guards (defaults: the app's).

    Parameters
    ----------
    max_norm_ratio : float
        Reject updates farther from the global model than this multiple of its norm (0: off).
    update_bound : {"none", "clip", "reject"}
        Bound every update by ``update_bound_multiple`` x the round's lower-median update
        norm per example: clip it to that norm or reject it.
    update_bound_multiple : float
        The multiple of that median the bound allows (> 1).
    norm_cap : {"auto", "none", "median", "server"}
        Norm normalisation before valuation and aggregation: every update rescaled to at most
        ``norm_cap_multiple`` x a reference norm, the round's lower-median update norm
        (``median``) or the norm of one server step's update (``server``); ``auto`` is
        ``median`` for a method that computes contributions and ``none`` for the others
        (:func:`fedowen_strategy.round.contribution.resolve_auto`).
    norm_cap_multiple : float
        The multiple of the reference norm (> 0).
    value_cap_multiple : float
        > 0 (default 1): the updates are valued rescaled to this multiple of the norm cap's
        reference (and averaged at ``norm_cap_multiple``), so an update's size above it buys
        no phi; 0: they are valued as they are averaged. It follows the norm cap: where the
        cap resolves to ``none`` there is no reference, and the updates are valued as
        averaged.
    value_cap_mode : {"at-most", "exactly"}
        How the value cap rescales: updates above it down to it (``at-most``), or every
        non-zero update to exactly it (``exactly``, the default: phi reads the direction
        alone, so a booster earns what its unscaled step would, and a short honest step is
        valued at the reference's length). Needs ``value_cap_multiple`` > 0 for ``exactly``.
        ``at-most`` did not stop boosting from paying on development seeds (a booster whose
        honest step is below the reference still gains up to it); ``exactly`` at multiple 1
        held boosted and adaptive attackers to an honest payout there, and on fresh seeds
        20-24 at MNIST alpha 0.1 but not at alpha 0.01 or on FashionMNIST, where a boosted
        update still moves the model further and is selected again
        (conf/defaults-next-fresh.toml; docs/arena.md).
    link_cosine : float
        Updates with pairwise cosine above it are linked into one player of the game, their
        phi and weight split among them (0: off). Applies to methods that compute
        contributions.
    duplicate_tolerance : float
        Updates within this relative distance of each other are copies
        (:func:`fedowen_strategy.defences.links.duplicate_groups`; 0: off): in the round they
        are caught a group of copies gets one member's weight, and its client ids are banned
        (never selected again, pay forfeited). Keep it at copy level: under one-class non-IID
        data honest updates came within 0.0007 of each other (docs/results/duplicates/).
    update_filter : {"none", "majority", "server-direction"}
        ``majority``: only the largest cluster of the round's update directions (HDBSCAN on
        cosine distances, a strict majority at least; :mod:`fedowen_strategy.defences.majority`,
        FLAME's filter) is valued and averaged; the rest are rejected (opt-in, issue 45).
        ``server-direction``: only updates of positive cosine with the server's own step on
        the evaluation set (FLTrust's trust as a filter,
        :mod:`fedowen_strategy.defences.server_direction`; opt-in, issue 45).
    robust_lr_threshold : int
        The robust learning rate's sign vote on the round's aggregate: where fewer than this
        many more updates agree on a coordinate's sign than disagree, the server's step there
        is reversed (:mod:`fedowen_strategy.defences.robust_lr`; 0: off; opt-in, issue 45).
    aggregate_noise : float
        FLAME's noise on the round's aggregate, standard deviation this multiple of the
        round's median update norm (the paper's lambda, 0.001; 0: off; opt-in, issue 45).
    statistics_cap : float
        > 0: each update's normalisation statistics (``running_mean``, ``running_var``)
        moved back towards the global model's until their deviation from them is at most this
        multiple of the round's lower-median deviation, the update keys untouched
        (:mod:`fedowen_strategy.defences.statistics`); 0 (the default): off, the statistics
        averaged as sent. A value below 1 caps the median client too. Off until its cost on
        honest BatchNorm runs is measured (models without statistics: nothing to do).
    """

    max_norm_ratio: float = declare.key(
        10.0, "reject updates beyond this x the model's norm (0: off)", name="max-norm-ratio")
    update_bound: str = declare.key(
        "none", "clip | reject | none: updates beyond the bound", name="update-bound")
    update_bound_multiple: float = declare.key(
        3.0, "the bound, x the round's median norm per example", name="update-bound-multiple")
    norm_cap: str = declare.key(
        "auto", "rescale updates to a reference: median | server | none | auto", name="norm-cap")
    norm_cap_multiple: float = declare.key(
        2.0, "the norm cap, x its reference", name="norm-cap-multiple")
    value_cap_multiple: float = declare.key(
        1.0, "updates valued at this x the reference (0: as averaged)", name="value-cap-multiple")
    value_cap_mode: str = declare.key(
        "exactly", "exactly | at-most the value cap", name="value-cap-mode")
    link_cosine: float = declare.key(
        0.98, "updates above this cosine are one player (0: off)", name="link-cosine")
    duplicate_tolerance: float = declare.key(
        1e-6, "updates this close are copies (0: off)", name="duplicate-tolerance")
    update_filter: str = declare.key(
        "none", "none | majority | server-direction", name="update-filter")
    robust_lr_threshold: int = declare.key(
        0, "the robust learning rate's theta (0: off)", name="robust-lr-threshold")
    aggregate_noise: float = declare.key(
        0.0, "noise on the aggregate, x the median norm (0: off)", name="aggregate-noise")
    statistics_cap: float = declare.key(
        0.0, "cap BatchNorm statistics' deviation at this x its median (0: off; < 1 "
        "caps the median client too)", name="statistics-cap")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these guards (:class:`~fedowen_strategy.settings.Settings`)."""
        k = partial(key, keys)
        checks = [
            (self.max_norm_ratio >= 0,
             f"{k('max_norm_ratio')}={self.max_norm_ratio!r} must be >= 0 (0 = off)"),
            (self.update_bound_multiple > 1,
             f"{k('update_bound_multiple')}={self.update_bound_multiple!r} must be > 1 (e.g. 3)"),
            (self.norm_cap_multiple > 0,
             f"{k('norm_cap_multiple')}={self.norm_cap_multiple!r} must be > 0 (1: the "
             "reference norm)"),
            (self.value_cap_multiple >= 0,
             f"{k('value_cap_multiple')}={self.value_cap_multiple!r} must be >= 0 (0: value "
             "the updates as they are averaged)"),
            (0 <= self.link_cosine < 1,
             f"{k('link_cosine')}={self.link_cosine!r} must lie in [0, 1) (0 = off)"),
            (0 <= self.duplicate_tolerance < 1,
             f"{k('duplicate_tolerance')}={self.duplicate_tolerance!r} must lie in [0, 1) "
             "(0 = off)"),
            (self.robust_lr_threshold >= 0,
             f"{k('robust_lr_threshold')}={self.robust_lr_threshold!r} must be >= 0 (0 = off; "
             "e.g. 4 of 10 clients a round)"),
            (self.aggregate_noise >= 0,
             f"{k('aggregate_noise')}={self.aggregate_noise!r} must be >= 0 (0 = off; FLAME's "
             "0.001)"),
            (math.isfinite(self.statistics_cap) and self.statistics_cap >= 0,
             f"{k('statistics_cap')}={self.statistics_cap!r} must be finite and >= 0 (0 = off; "
             "e.g. 3; below 1 it caps the median client too)"),
        ]
        found = [message for ok, message in checks if not ok]
        found += one_of(k("update_bound"), self.update_bound, UPDATE_BOUNDS)
        found += one_of(k("norm_cap"), self.norm_cap, NORM_CAPS)
        found += one_of(k("value_cap_mode"), self.value_cap_mode, VALUE_CAP_MODES)
        found += one_of(k("update_filter"), self.update_filter, UPDATE_FILTERS)
        if self.value_cap_mode == "exactly" and self.value_cap_multiple == 0:
            found.append(f"{k('value_cap_mode')}='exactly' values every update at "
                         f"{k('value_cap_multiple')} x the norm cap's reference: set "
                         f"{k('value_cap_multiple')} > 0 (e.g. 1.0)")
        return found


#: A strategy's guards in force and its resolved norm cap (what an omniscient attacker reads).
Defence = tuple[Guards, str]


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
    reference = _cap(out, global_state, guards, norm_cap, server_update)
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
                           exactly=guards.value_cap_mode == "exactly")
        out.valued = [u.state for u in valued.updates]
        out.record.update(value_cap=value_cap, value_capped=valued.clipped)
    if out.updates:
        out.groups = _groups(out, global_state, guards, value_players)
    if out.copies:
        log.warning("round %d: copies share one weight and are linked (not selected again, no "
                    "payout): %s", server_round, out.copies)
    if out.links:
        log.info("round %d: near-parallel updates play as one (cosine > %g): %s", server_round,
                 guards.link_cosine, out.links)
    return out


def _cap(out: GuardedRound, global_state: Mapping[str, NDArray], guards: Guards, norm_cap: str,
         server_update: Callable[[], Mapping[str, NDArray]] | None) -> float | None:
    """The norm cap applied to ``out.updates`` (recorded); returns its reference norm."""
    if norm_cap == "none" or not out.updates:
        return None
    server_norm = (update_norm(server_update(), global_state)
                   if norm_cap == "server" and server_update is not None else None)
    norms = [] if server_norm is not None else [update_norm(u.state, global_state)
                                                for u in out.updates]
    reference = cap_reference(norm_cap, norms, server_norm)
    cap = norm_cap_at(guards, reference)
    capped = cap_norms(out.updates, global_state, cap, norms=norms or None)
    out.updates = capped.updates
    out.record.update(norm_cap=cap, capped=capped.clipped)
    return reference


def _groups(out: GuardedRound, global_state: Mapping[str, NDArray], guards: Guards,
            value_players: bool) -> list[list[int]]:
    """Copies merged with near-parallel updates; fills ``copies``, ``cosines``, ``links``."""
    states = [u.state for u in out.updates]
    ids = [u.client_id for u in out.updates]
    gram = gram_matrix(states, global_state)  # once: the copy screen and the cosines
    copies = duplicate_groups(states, global_state, guards.duplicate_tolerance, gram)
    out.copies = [[ids[i] for i in g] for g in copies]
    if not value_players or len(states) < 2:
        return copies
    cosines = cosine_matrix(states, global_state, gram)
    if len(states) <= RECORD_COSINES_UP_TO:  # the honest pairs' distribution (links)
        out.record["cosines"] = upper_triangle(cosines)
    near = link_groups(cosines, guards.link_cosine)
    if near:
        out.links = [[ids[i] for i in g] for g in near]
        out.record["links"] = [list(g) for g in out.links]
    return merge_groups(len(states), copies, near)
