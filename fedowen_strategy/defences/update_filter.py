"""``update-filter``: only the updates a filter admits are valued and averaged (opt-in, issue
45): ``majority``, the largest cluster of the round's update directions (FLAME's,
:mod:`fedowen_strategy.defences.majority`), or ``server-direction``, the updates of positive
cosine with the server's own step (:mod:`fedowen_strategy.defences.server_direction`);
``none`` (the default): off."""

from __future__ import annotations

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.majority import filter_majority
from fedowen_strategy.defences.server_direction import filter_server_direction


class UpdateFilter(Guard):
    """The filter ``update-filter`` names; ``server-direction`` needs the server's step."""

    name = "update-filter"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        how = view.guards.update_filter
        if how == "majority" and round_.updates:
            round_.updates, outside = filter_majority(round_.updates, view.global_state)
            round_.rejected.update(outside)
        if how == "server-direction" and round_.updates:
            if view.server_update is None:
                raise ValueError("update_filter='server-direction' needs server_update (one "
                                 "server training step on the evaluation set)")
            round_.updates, against, cosines = filter_server_direction(
                round_.updates, view.global_state, view.server_update())
            round_.rejected.update(against)
            round_.record["server_cosines"] = cosines
        return round_

    def summary(self, guards: Guards) -> str:
        return f"update-filter ({guards.update_filter})"
