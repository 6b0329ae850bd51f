"""``statistics-rule``: how the aggregate combines the clients' normalisation statistics
(``running_mean``, ``running_var``): their coordinate-wise weighted median under the round's
aggregation weights (``median``, the default) or the weighted mean (``mean``, the strategy's own
average left as it is). :mod:`fedowen_strategy.defences.statistics` has the rule and why.

A settle step: it replaces the aggregate's statistics by the median of the combined updates'
(at the weights the strategy gave them: FedOwen's valuation weights, a peer's, Flower's
num-examples), whatever the strategy did with them (an average, Krum's pick, FedMedian's
median). Models without statistics: nothing to do.
"""

from __future__ import annotations

from numpy.typing import NDArray

from fedowen_strategy.defences.base import Guard, Settled, Settling
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.statistics import median_statistics


class StatisticsRule(Guard):
    """The statistics median (recorded: ``statistics_rule``, ``statistics_shift``,
    ``statistics_farthest``)."""

    name = "statistics-rule"

    def settle(self, state: dict[str, NDArray], settling: Settling) -> Settled:
        if settling.view.guards.statistics_rule != "median":
            return state, {}
        median = median_statistics(settling.states, settling.client_ids, settling.weights,
                                   settling.view.global_state)
        if median is None:
            return state, {}
        return {**state, **median.statistics}, dict(median.record)

    def summary(self, guards: Guards) -> str:
        return f"statistics-rule ({guards.statistics_rule})"
