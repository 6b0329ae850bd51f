"""``links``: exact copies (``duplicate-tolerance``; their ids are banned by the strategy)
merged with near-parallel updates (``link-cosine``, for a strategy that values players), each
group one player of the game (:mod:`fedowen_strategy.defences.links`).

The step writes :attr:`GuardedRound.groups <fedowen_strategy.defences.base.GuardedRound.
groups>` (indices into the round's updates, so it comes after every step that drops or reorders
them), ``copies`` and ``links``; rounds of at most :data:`RECORD_COSINES_UP_TO` updates record
their pairwise cosines (the honest pairs' distribution, from which ``link-cosine`` was set).
"""

from __future__ import annotations

import logging

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView, measured_norms
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.links import (
    duplicate_groups,
    link_groups,
    merge_groups,
    upper_triangle,
)
from fedowen_strategy.updates import cosine_matrix

log = logging.getLogger(__name__)

#: Rounds of at most this many updates record their pairwise cosines.
RECORD_COSINES_UP_TO = 32


def whole_round(links: list[list[str]], updates: int) -> bool:
    """Whether one link group holds every update of a round of 2 or more (the links then say
    consensus, not collusion: the warning's case)."""
    return updates >= 2 and any(len(group) == updates for group in links)


class Links(Guard):
    """Copies and near-parallel links, grouped into the game's players."""

    name = "links"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        if not round_.updates:
            return round_
        guards = view.guards
        states = [u.state for u in round_.updates]
        ids = [u.client_id for u in round_.updates]
        copies = duplicate_groups(states, view.global_state, guards.duplicate_tolerance,
                                  measured_norms(round_.updates))
        round_.copies = [[ids[i] for i in g] for g in copies]
        round_.groups = copies
        if view.value_players and len(states) >= 2:
            cosines = cosine_matrix(states, view.global_state)
            if len(states) <= RECORD_COSINES_UP_TO:
                round_.record["cosines"] = upper_triangle(cosines)
            near = link_groups(cosines, guards.link_cosine)
            if near:
                round_.links = [[ids[i] for i in g] for g in near]
                round_.record["links"] = [list(g) for g in round_.links]
            round_.groups = merge_groups(len(states), copies, near)
        if round_.copies:
            log.warning("round %d: copies share one weight and are linked (not selected again, "
                        "no payout): %s", view.server_round, round_.copies)
        if round_.links and whole_round(round_.links, len(ids)):
            log.warning("round %d: all %d updates are near-parallel (cosine > %g) and play as "
                        "one: phi cannot tell them apart and weighs them alike; on a task whose "
                        "honest updates agree this closely (a binary one, say) raise "
                        "`link-cosine` (or 0: no links)", view.server_round, len(ids),
                        guards.link_cosine)
        elif round_.links:
            log.info("round %d: near-parallel updates play as one (cosine > %g): %s",
                     view.server_round, guards.link_cosine, round_.links)
        return round_

    def summary(self, guards: Guards) -> str:
        return (f"links (copies within {guards.duplicate_tolerance:g}, near-parallel above "
                f"cosine {guards.link_cosine:g})")
