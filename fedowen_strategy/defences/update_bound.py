"""``update-bound``: clip or reject updates far above the round's median norm per example
(:mod:`fedowen_strategy.defences.bounds`; ``update-bound = none``, the default: off)."""

from __future__ import annotations

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView
from fedowen_strategy.defences.bounds import bound_updates
from fedowen_strategy.defences.guard_settings import Guards


class UpdateBound(Guard):
    """:func:`~fedowen_strategy.defences.bounds.bound_updates` under ``update-bound`` and
    ``update-bound-multiple``."""

    name = "update-bound"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        guards = view.guards
        bounded = bound_updates(round_.updates, view.global_state, guards.update_bound,
                                guards.update_bound_multiple)
        round_.updates = bounded.updates
        round_.rejected.update(bounded.rejected)
        round_.clipped.update(bounded.clipped)
        return round_

    def summary(self, guards: Guards) -> str:
        return (f"update-bound ({guards.update_bound}, x{guards.update_bound_multiple:g} the "
                "median norm per example)")
