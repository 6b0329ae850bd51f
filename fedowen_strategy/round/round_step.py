"""One aggregation round of FedOwen as a pure function: guard, value, average, record.

:class:`~fedowen_strategy.strategy.FedOwen` parses the replies, hands them to
:func:`aggregate_round` and keeps what the round taught it (the bandit's phi, the ids caught
sending copies). Everything here is a function of its arguments and the valuation stream
``rng``, so a reader can run a round by hand: a list of
:class:`~fedowen_strategy.replies.ClientUpdate` and a global model are all it needs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.base import Guard, RoundView, Settling, settle_round
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.guards import guard_round
from fedowen_strategy.defences.table import build
from fedowen_strategy.replies import ParsedReplies
from fedowen_strategy.round import round_record
from fedowen_strategy.round.aggregation import step_average, weighted_average
from fedowen_strategy.round.contribution import UtilityFactory, ValuationSettings, value_round
from fedowen_strategy.round.round_valuers import NO_PHI, RoundValuation

log = logging.getLogger(__name__)

#: ``(client ids, weights) -> weights``: a selector's aggregation weights for the round.
Reweight = Callable[[Sequence[str], NDArray[np.float64]], NDArray[np.float64]]


@dataclass(frozen=True)
class RoundOutcome:
    """What one round decided.

    ``state`` is the new global model (``None`` keeps the old one: no usable update);
    ``parsed`` the replies after the guards (in client-id order, aligned with ``valuation``);
    ``copies`` the client ids of exact copies (to ban); ``links`` those of near-parallel
    groups (one player each this round: the bandit's link memory); ``record`` and ``rows`` the
    round record and ledger rows (:mod:`fedowen_strategy.round.round_record`).
    """

    state: dict[str, NDArray] | None
    parsed: ParsedReplies
    copies: list[list[str]]
    links: list[list[str]]
    valuation: RoundValuation | None
    record: dict[str, Any]
    rows: list[dict[str, Any]]


def aggregate_round(parsed: ParsedReplies, global_state: Mapping[str, NDArray], *,
                    selected: Sequence[str], valuation: ValuationSettings, guards: Guards,
                    norm_cap: str, utility_factory: UtilityFactory | None,
                    rng: np.random.Generator, server_round: int,
                    extra: Mapping[str, Any] | None = None,
                    server_update: Callable[[], Mapping[str, NDArray]] | None = None,
                    reweight: Reweight | None = None, step: bool = False,
                    defences: Sequence[Guard] | None = None) -> RoundOutcome:
    """Screen the parsed replies (the screen steps of ``defences``:
    :func:`~fedowen_strategy.defences.guards.guard_round`), value them
    (:func:`~fedowen_strategy.round.contribution.value_round`), average them with the
    valuation's weights and settle the aggregate (the settle steps: the statistics rule, the
    sign vote, noise).

    Parameters
    ----------
    selected : sequence of str
        The client ids asked to train (for the record).
    norm_cap : str
        The resolved norm cap (:func:`~fedowen_strategy.round.contribution.resolve_auto`).
    rng : numpy.random.Generator
        The valuation stream.
    extra : mapping, optional
        Fields added to the round record (e.g. ``ray_nodes``).
    server_update : callable, optional
        One server step's state, the reference of ``norm_cap = "server"``.
    reweight : callable, optional
        ``(client ids, weights) -> weights`` of the accepted updates: the selector's say on the
        aggregation (:meth:`fedowen_strategy.selectors.base.Selector.weigh`); the round
        averages and records the weights it returns (they must sum to 1, unless ``step``).
    step : bool
        The weights are a step from the global model (:func:`~fedowen_strategy.round.
        aggregation.step_average`: ``global + sum_i w_i delta_i``, the global model keeping
        ``1 - sum w``; the record's ``global_weight``), as the selector says
        (:meth:`fedowen_strategy.selectors.base.Selector.step_weights`). Default: an average.
    defences : sequence of Guard, optional
        The run's defence list, in order (default: FedOwen's,
        :data:`~fedowen_strategy.defences.table.FEDOWEN_DEFENCES`).
    """
    defences = build("auto", fedowen=True) if defences is None else defences
    value_players = valuation.method not in NO_PHI
    guarded = guard_round(parsed.updates, global_state, guards, norm_cap=norm_cap,
                          value_players=value_players, server_round=server_round,
                          server_update=server_update, defences=defences)
    parsed = dataclasses.replace(parsed, updates=guarded.updates, clipped=guarded.clipped,
                                 rejected={**parsed.rejected, **guarded.rejected})
    fields = {**(extra or {}), **guarded.record}
    if not parsed.updates:
        log.warning("round %d: no usable update (%d failed, %d rejected); global model kept",
                    server_round, len(parsed.failed), len(parsed.rejected))
        record = round_record.round_record(selected, parsed, valuation.method, [], fields, None)
        return RoundOutcome(None, parsed, guarded.copies, guarded.links, None, record, [])
    states = [u.state for u in parsed.updates]
    # the states to value: the averaged ones, or (value_cap_multiple) the same at a tighter cap
    val = value_round(guarded.valued or states, [u.num_examples for u in parsed.updates],
                      global_state, valuation, utility_factory, rng, guarded.groups)
    if reweight is not None:
        val = dataclasses.replace(val, weights=np.asarray(
            reweight([u.client_id for u in parsed.updates], val.weights), dtype=np.float64))
    log.info("aggregate_train: round %d, %d updates valued by %s in %.2fs (%d evals)",
             server_round, len(states), valuation.method, val.seconds, val.n_evals)
    if step:
        combined = step_average(states, val.weights, global_state)
        fields["global_weight"] = 1.0 - float(np.sum(val.weights))
    else:
        combined = weighted_average(states, val.weights)
    view = RoundView(global_state, guards, norm_cap, value_players, server_round, server_update)
    state, settled = settle_round(defences, combined, Settling(
        view, states, [u.client_id for u in parsed.updates], val.weights, rng, guarded.record))
    record = round_record.round_record(selected, parsed, valuation.method, guarded.copies,
                                       {**fields, **settled}, val)
    return RoundOutcome(state, parsed, guarded.copies, guarded.links, val, record,
                        round_record.ledger_rows(server_round, parsed, val))
