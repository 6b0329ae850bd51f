"""``norm-ratio``: reject updates farther from the global model than ``max-norm-ratio`` x its
norm (an absurd norm: a diverged client or a crude booster; 0: off).

The check :func:`fedowen_strategy.replies.parse_replies` applied as it parsed each reply until
issue 72, now one step of the list: the same limit
(:func:`~fedowen_strategy.replies.norm_ratio_limit`), the same norm
(:func:`~fedowen_strategy.updates.update_norm`, kept on the update so the steps after it do not
measure it again) and the same reason.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from fedowen_strategy.defences.base import Guard, GuardedRound, RoundView
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.replies import norm_ratio_limit
from fedowen_strategy.updates import model_norm, update_norm

log = logging.getLogger(__name__)


class NormRatio(Guard):
    """Reject updates beyond ``max-norm-ratio`` x the global model's norm."""

    name = "norm-ratio"

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        ratio = view.guards.max_norm_ratio
        if not ratio > 0 or not round_.updates:
            return round_
        global_norm = model_norm(view.global_state)
        limit = norm_ratio_limit(ratio, global_norm)
        if limit is None:  # a global model of norm 0: nothing to compare with
            return round_
        kept = []
        for upd in round_.updates:
            norm = upd.norm if upd.norm is not None else update_norm(upd.state,
                                                                     view.global_state)
            if norm > limit:
                round_.rejected[upd.client_id] = (
                    f"update norm {norm:.3g} exceeds {ratio} x the global model's norm "
                    f"{global_norm:.3g}")
                log.warning("rejected the update of client %s: %s", upd.client_id,
                            round_.rejected[upd.client_id])
            else:
                kept.append(replace(upd, norm=norm))
        round_.updates = kept
        return round_

    def summary(self, guards: Guards) -> str:
        return f"norm-ratio (max-norm-ratio={guards.max_norm_ratio:g})"
