"""The defence protocol: what one defence does to a round, and what it is handed.

A defence is a :class:`Guard`: one module in this package and one row in the table
(:data:`fedowen_strategy.defences.table.DEFENCES`), applied with the others as an ordered list
(the run config's ``defences``). Like Flower's own DP wrappers, which clip the replies before
the wrapped strategy aggregates them and add noise to what it returns, a guard may act at four
points of a round, each optional (the base class passes everything through):

- :meth:`Guard.dispatch`: the global model the strategy is about to send, before any message
  of the round carries it (BackdoorIndicator plants its indicator task there); the updates of
  the round are then read against the model sent;
- :meth:`Guard.refuse`: the round's reply messages, before they are decoded (the identity
  check: a node may not speak for another's client id);
- :meth:`Guard.screen`: the decoded updates (:class:`~fedowen_strategy.replies.ClientUpdate`,
  in client-id order) before they are valued and aggregated: reject, clip, rescale, group;
- :meth:`Guard.settle`: the aggregate, once the strategy has combined the screened updates:
  rewrite it (the statistics rule, the sign vote, noise).

The same list runs inside FedOwen's round (its ``configure_train`` and
:func:`fedowen_strategy.round.round_step.aggregate_round`) and around any Flower strategy or
peer (:class:`fedowen_strategy.defences.defended.Defended`). A guard reads its settings from
the round's :class:`~fedowen_strategy.defences.guard_settings.Guards` (the run-config keys of
the same names) or from its own constructor, keeps no state between rounds unless it says
so, and draws randomness only from the generator it is handed. Pure functions of their inputs
otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.nodes import client_order
from fedowen_strategy.replies import ClientUpdate, record_to_state, state_to_record
from fedowen_strategy.updates import State

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, Message

#: What a settle step returns: the new aggregate and the round record's fields it adds.
Settled = tuple[dict[str, NDArray], dict[str, Any]]


class IdentityCheck(Protocol):
    """The run's identity book, as the identity guard asks it
    (:meth:`fedowen_strategy.defences.identity.Roster.check`)."""

    def check(self, replies: Sequence[Message], connected: Collection[int]
              ) -> tuple[list[Message], dict[str, str]]: ...


@dataclass(frozen=True)
class Gate:
    """What a :meth:`Guard.refuse` step reads: the run's identity book (None where the strategy
    keeps none) and the nodes connected this round."""

    book: IdentityCheck | None = None
    connected: tuple[int, ...] = ()


@dataclass(frozen=True)
class Dispatching:
    """What a :meth:`Guard.dispatch` step reads: the round about to be sent and the settings in
    force."""

    server_round: int
    guards: Guards = field(default_factory=Guards)


@dataclass(frozen=True)
class RoundView:
    """What a :meth:`Guard.screen` step reads of the round.

    ``global_state``: the model the updates started from; ``guards``: the settings in force;
    ``norm_cap``: the norm cap resolved for the strategy (:func:`fedowen_strategy.round.
    contribution.resolve_auto`; ``none`` around a Flower strategy); ``value_players``: the
    strategy values players (the value cap and near-parallel links act only then);
    ``server_update``: one server training step's state (None without one)."""

    global_state: Mapping[str, NDArray]
    guards: Guards = field(default_factory=Guards)
    norm_cap: str = "none"
    value_players: bool = False
    server_round: int = 0
    server_update: Callable[[], Mapping[str, NDArray]] | None = None


@dataclass(frozen=True)
class Settling:
    """What a :meth:`Guard.settle` step reads: the round (``view``), the screened updates'
    states that were combined, their client ids and the weights the strategy gave them (aligned;
    they sum to 1 unless the strategy steps from the global model), the round's generator
    (FedOwen's valuation stream; a wrapper's own seeded one) and ``screened``, the round
    record's fields the screen steps added (:attr:`GuardedRound.record`): a step that acts in
    both reads there what its screen measured (``flame``: its clip bound)."""

    view: RoundView
    states: Sequence[State]
    client_ids: Sequence[str]
    weights: NDArray[np.float64]
    rng: np.random.Generator
    screened: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class GuardedRound:
    """A round's updates after the screen steps (in client-id order), and what they did.

    ``groups`` index ``updates``: each is one player of the game. ``valued`` (the value cap)
    holds the states to value, aligned with ``updates``; empty: value ``updates`` themselves.
    ``copies`` are the client ids of exact copies (to ban), ``links`` those of near-parallel
    groups (the strategy's bandit reads them here). ``reference`` is the norm cap's reference
    norm (the value cap's), where a norm cap measured one. ``record`` holds the round record's
    fields the steps add (``norm_cap`` and ``capped``, ``value_cap`` and ``value_capped``,
    ``statistics_cap`` and ``statistics_capped``, ``server_cosines``, ``cosines``, ``links``).

    A step that changes an update's vector resets its ``ClientUpdate.norm`` (None); a step that
    measured one may store it there, so the steps after it do not measure it again.
    """

    updates: list[ClientUpdate]
    rejected: dict[str, str] = field(default_factory=dict)
    clipped: dict[str, float] = field(default_factory=dict)
    groups: list[list[int]] = field(default_factory=list)
    valued: list[Mapping[str, NDArray]] = field(default_factory=list)
    copies: list[list[str]] = field(default_factory=list)
    links: list[list[str]] = field(default_factory=list)
    reference: float | None = None
    record: dict[str, Any] = field(default_factory=dict)


class Guard:
    """One defence. Subclasses set :attr:`name` (its row in the table) and override the hooks
    they act in; the others pass the round through."""

    #: The defence's name in ``defences`` (its row in the table).
    name: ClassVar[str] = ""

    def dispatch(self, state: dict[str, NDArray], dispatching: Dispatching
                 ) -> dict[str, NDArray]:
        """The model to send this round instead of ``state`` (the global model); the base
        class sends ``state`` itself. A step that overrides this may keep what it needs of the
        round until its :meth:`screen` (and says so)."""
        return state

    def refuse(self, replies: list[Message], gate: Gate) -> tuple[list[Message], dict[str, str]]:
        """The replies kept, and the refused ones (``node:<id>`` or client id -> reason)."""
        return replies, {}

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        """The round after this step (the one given, updated, or a new one)."""
        return round_

    def settle(self, state: dict[str, NDArray], settling: Settling) -> Settled:
        """The aggregate after this step, and the round record's fields it adds."""
        return state, {}

    def summary(self, guards: Guards) -> str:
        """One line for the strategy's summary: what this step does under ``guards``."""
        return self.name


def measured_norms(updates: Sequence[ClientUpdate]) -> list[float] | None:
    """Every update's ``norm`` where a step before measured all of them (the norm cap does),
    else None: the step then measures them itself (the same numbers, not computed twice)."""
    norms = [u.norm for u in updates if u.norm is not None]
    return norms if len(norms) == len(updates) else None


def dispatches(guard: Guard) -> bool:
    """Whether ``guard`` changes the model sent (its class overrides :meth:`Guard.dispatch`)."""
    return type(guard).dispatch is not Guard.dispatch


def dispatch_model(defences: Sequence[Guard], arrays: ArrayRecord, dispatching: Dispatching
                   ) -> ArrayRecord:
    """The model a strategy sends: ``arrays`` after every :meth:`Guard.dispatch` step in
    order, or ``arrays`` itself (the very record, not decoded) when no step dispatches, so a
    list without such a step sends what it sent before the hook existed."""
    steps = [guard for guard in defences if dispatches(guard)]
    if not steps:
        return arrays
    state = record_to_state(arrays)
    for guard in steps:
        state = guard.dispatch(state, dispatching)
    return state_to_record(state)


def refuse_replies(defences: Sequence[Guard], replies: list[Message], gate: Gate
                   ) -> tuple[list[Message], dict[str, str]]:
    """Every :meth:`Guard.refuse` step in order: the replies kept and all refused."""
    refused: dict[str, str] = {}
    for guard in defences:
        replies, out = guard.refuse(replies, gate)
        refused.update(out)
    return replies, refused


def screen_round(defences: Sequence[Guard], updates: Sequence[ClientUpdate], view: RoundView
                 ) -> GuardedRound:
    """Every :meth:`Guard.screen` step in order over the round's ``updates``, first put in
    client-id order (:func:`~fedowen_strategy.nodes.client_order`): no step depends on arrival
    times, and the estimator's sampled orders (and float sums) see the same players."""
    round_ = GuardedRound(sorted(updates, key=lambda upd: client_order(upd.client_id)))
    for guard in defences:
        round_ = guard.screen(round_, view)
    return round_


def settle_round(defences: Sequence[Guard], state: dict[str, NDArray], settling: Settling
                 ) -> Settled:
    """Every :meth:`Guard.settle` step in order over the round's aggregate ``state``: the
    final aggregate and the record fields they added."""
    record: dict[str, Any] = {}
    for guard in defences:
        state, fields = guard.settle(state, settling)
        record.update(fields)
    return state, record
