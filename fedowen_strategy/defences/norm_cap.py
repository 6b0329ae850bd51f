"""``norm-cap``: every update rescaled to at most ``norm-cap-multiple`` x a reference norm
before it is valued or averaged (:func:`fedowen_strategy.defences.bounds.cap_norms`).

The reference is the round's lower-median update norm (``median``) or the norm of one server
step's update (``server``); ``auto`` is ``median`` for a method that computes contributions and
``none`` for the others (:func:`fedowen_strategy.round.contribution.resolve_auto`, which the
strategy calls: the step reads the resolved value, :attr:`RoundView.norm_cap
<fedowen_strategy.defences.base.RoundView.norm_cap>`). The step keeps the reference on the round
(the value cap's) and each update's norm after it on the update (the copies screen's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView
from fedowen_strategy.defences.bounds import cap_norms, lower_median, norms_of
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.updates import update_norm

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


class NormCap(Guard):
    """The norm cap of the strategy's resolved ``norm-cap`` (recorded: ``norm_cap``,
    ``capped``)."""

    name = "norm-cap"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        if view.norm_cap == "none" or not round_.updates:
            return round_
        server = view.server_update
        server_norm = (update_norm(server(), view.global_state)
                       if view.norm_cap == "server" and server is not None else None)
        norms = [] if server_norm is not None else norms_of(round_.updates, view.global_state)
        reference = cap_reference(view.norm_cap, norms, server_norm)
        cap = norm_cap_at(view.guards, reference)
        capped = cap_norms(round_.updates, view.global_state, cap, norms=norms or None)
        round_.updates = capped.updates
        round_.reference = reference
        round_.record.update(norm_cap=cap, capped=capped.clipped)
        if norms:  # each update's norm after the cap, for the steps after it
            round_.updates = [replace(u, norm=update_norm(u.state, view.global_state)
                                      if u.client_id in capped.clipped else norm)
                              for u, norm in zip(capped.updates, norms, strict=True)]
        return round_

    def summary(self, guards: Guards) -> str:
        return f"norm-cap ({guards.norm_cap}, x{guards.norm_cap_multiple:g} its reference)"
