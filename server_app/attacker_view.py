"""What an omniscient attacker reads of the run's defence (:mod:`server_app.byzantine`): the
largest norm an update may have and pass unchanged (:func:`attacker_bound`), and what the
defence list's screen steps would keep of a round (:func:`screens_admit`), which
``adaptive-backdoor`` with ``adversary-knows = "defences"`` shapes its updates to pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from numpy.typing import NDArray

from fedowen_strategy.defences.base import RoundView, screen_round
from fedowen_strategy.defences.bounds import lower_median
from fedowen_strategy.defences.guard_settings import Defence
from fedowen_strategy.defences.guards import Median, bound_in_force
from fedowen_strategy.defences.table import DEFENCES, resolve
from fedowen_strategy.replies import ClientUpdate
from fedowen_strategy.updates import State
from fedowen_task.adversary.server import MARGIN, median_faced
from server_app.config import RunConfig


def attacker_bound(defence: Defence | None, norms: Sequence[float], examples: Sequence[int],
                   own_examples: int, global_norm: float, server_norm: float | None = None,
                   others: Sequence[float] | None = None, attackers: int = 0) -> float | None:
    """The largest norm an update of ``own_examples`` examples may have and pass the run's
    defences unchanged, as an omniscient attacker knows them: FedOwen's own
    :func:`fedowen_strategy.defences.guards.bound_in_force` under the strategy's ``defence`` (its
    guards and resolved norm cap: :attr:`server_app.strategies.ServerStrategy.defence`), read from
    the round's honest update ``norms`` and ``examples`` (the attackers' honest ones
    included), the global model's norm and, for ``norm-cap = "server"``, ``server_norm``, the
    norm of the round's server step (without it, the median is the attacker's estimate).
    Given the honest ``others`` and the number of ``attackers`` sending at the bound, the
    median the cap reads is the one their own updates leave (:func:`median_faced`), not the
    median of every honest update, which a multiple above 1 puts below what the server will
    let through. None without a defence (a strategy without FedOwen's guards: FLTrust
    rescales every update to the server's norm whatever was sent).
    """
    if defence is None:
        return None
    guards, norm_cap = defence
    median: Median = lower_median
    if others is not None and attackers > 0:
        def median(_: Sequence[float]) -> float | None:
            return median_faced(others, attackers, MARGIN * guards.norm_cap_multiple)
    return bound_in_force(guards, norm_cap, norms=norms, examples=examples,
                          own_examples=own_examples, global_norm=global_norm,
                          server_norm=server_norm, median=median)


def screens_admit(cfg: RunConfig, defence: Defence | None, global_state: State,
                  honest: Sequence[ClientUpdate],
                  attackers: Callable[[NDArray], Sequence[ClientUpdate]], server_round: int
                  ) -> Callable[[NDArray], list[bool]]:
    """For the attackers' updates ``(m, d)`` (made into replies by ``attackers``), whether the
    run's defence list (``cfg.defences``) would keep each: its screen steps run on the round's
    ``honest`` updates and these, as the strategy runs them, under the strategy's guards and
    resolved norm cap (``defence``; the run config's guards and no cap without one). The steps
    are fresh guards of the table's rows, so no guard's state moves; ``indicator``'s, which
    reads the model it planted, is left out."""
    fedowen = cfg.strategy == "fedowen"
    steps = [DEFENCES[name].make() for name in resolve(cfg.defences, fedowen)
             if name != "indicator"]
    guards, norm_cap = defence if defence is not None else (cfg.guards(), "none")
    view = RoundView(global_state, guards, norm_cap, fedowen, server_round)

    def admits(deltas: NDArray) -> list[bool]:
        sent = list(attackers(deltas))
        rejected = screen_round(steps, [*honest, *sent], view).rejected
        return [u.client_id not in rejected for u in sent]
    return admits
