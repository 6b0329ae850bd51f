"""``statistics-cap``: each update's normalisation statistics moved back towards the global
model's until their deviation is at most ``statistics-cap`` x the round's lower-median one
(:func:`fedowen_strategy.defences.statistics.cap_statistics`; 0, the default: off). Before the
valuation in FedOwen, so the valued coalitions see the capped statistics; before the wrapped
strategy combines them elsewhere. The update keys are untouched (their norms stand)."""

from __future__ import annotations

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.statistics import cap_statistics


class StatisticsCap(Guard):
    """The statistics cap (recorded: ``statistics_cap``, ``statistics_capped``)."""

    name = "statistics-cap"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        statistics = cap_statistics(round_.updates, view.global_state,
                                    view.guards.statistics_cap)
        if statistics.cap is not None:
            round_.updates = statistics.updates
            round_.record.update(statistics_cap=statistics.cap,
                                 statistics_capped=statistics.capped)
        return round_

    def summary(self, guards: Guards) -> str:
        return f"statistics-cap (x{guards.statistics_cap:g} the median deviation; 0: off)"
