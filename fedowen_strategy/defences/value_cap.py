"""``value-cap``: the updates valued at ``value-cap-multiple`` x the norm cap's reference
(``value-cap-mode``: at most that norm, or every non-zero update at exactly it), while they are
averaged as the norm cap left them, so an update's size above it buys no phi.

It follows the norm cap: without a reference (``norm-cap`` resolved to ``none``, or no norm-cap
step before it) the updates are valued as averaged; and it acts only for a strategy that values
players. What it writes is :attr:`GuardedRound.valued
<fedowen_strategy.defences.base.GuardedRound.valued>`, aligned with the updates.
"""

from __future__ import annotations

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView, measured_norms
from fedowen_strategy.defences.bounds import cap_norms
from fedowen_strategy.defences.guard_settings import Guards


class ValueCap(Guard):
    """The valuation's cap (recorded: ``value_cap``, ``value_capped``)."""

    name = "value-cap"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        guards, reference = view.guards, round_.reference
        if not (reference and guards.value_cap_multiple > 0 and view.value_players):
            return round_
        value_cap = guards.value_cap_multiple * reference
        valued = cap_norms(round_.updates, view.global_state, value_cap,
                           exactly=guards.value_cap_mode == "exactly",
                           norms=measured_norms(round_.updates))
        round_.valued = [u.state for u in valued.updates]
        round_.record.update(value_cap=value_cap, value_capped=valued.clipped)
        return round_

    def summary(self, guards: Guards) -> str:
        return (f"value-cap ({guards.value_cap_mode} x{guards.value_cap_multiple:g} the norm "
                "cap's reference)")
