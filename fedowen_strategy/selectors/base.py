"""The selector protocol: what every client selector does, and what it is handed.

A :class:`Selector` is one selector over one run: built from its settings (its run-config
keys) with an empty memory, it

- **chooses** ``k`` of a round's :class:`Pool` with the run's seeded generator, and may **ask**
  clients for what it needs before it does, through the Message API (:data:`AskClients`:
  Power-of-Choice sends its candidates the global model and reads their local loss);
- asks the **trained** clients for more than their update (:meth:`Selector.train_config`:
  Oort's squared losses);
- **observes** the round that followed (:class:`Seen`: the accepted replies, their updates,
  their phi when the round was valued, the round record);
- may **weigh** the round's replies in the aggregation (:meth:`Selector.weigh`: importance
  weights for an unbiased sampler, as an average or, :meth:`Selector.step_weights`, as a step
  from the global model);
- **saves and loads** its memory for checkpoints (:meth:`Selector.state`, JSON-able).

The identity cap and the link groups are not a selector's business: the run's
:class:`~fedowen_strategy.selectors.shared.Selection` applies them to every selector (the pool
holds only the clients the cap leaves eligible; :attr:`Pool.arms` names the lasting link
groups, for a selector that treats each group as one arm). A selector subclasses
:class:`Selector` to inherit the defaults of the optional methods; only :meth:`choose` is
required.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.settings import NO_KEYS, Keys, Settings

if TYPE_CHECKING:  # the selectors import without Flower (the run config's checks need none)
    from flwr.app import RecordDict

#: The values a train or query config may carry (Flower's ConfigRecord scalars).
ConfigValue = int | float | str | bool | bytes


class AskClients(Protocol):
    """A selector's way to clients before it chooses: each of ``indices`` (into the pool's
    keys) is sent a ``query`` message carrying ``config`` (and the round's global model, with
    ``with_model``); one reply content per index comes back, ``None`` where the client failed
    or did not answer. Every message counts into the round record's
    ``selection.extra_messages``."""

    def __call__(self, indices: Sequence[int], config: Mapping[str, ConfigValue],
                 with_model: bool = True) -> list[RecordDict | None]: ...


@dataclass(frozen=True)
class Pool:
    """Who may be chosen this round.

    Attributes
    ----------
    keys : tuple of str
        The clients' ids, in id order: those the identity cap leaves eligible (all of them
        when fewer than ``k`` are).
    k : int
        How many to choose, ``1 <= k <= len(keys)``.
    server_round : int
        The round, from 1 (a resumed run's rounds go on counting).
    arms : ndarray of int or None
        Each key's lasting link group (``link-memory``; linked identities share one arm), or
        None when no two keys share one.
    """

    keys: tuple[str, ...]
    k: int
    server_round: int
    arms: NDArray[np.int64] | None = None


@dataclass(frozen=True)
class Choice:
    """A selector's pick: ``indices`` into the pool's keys, sorted; ``how`` it was made (a
    word for the log: ``explored``, ``posterior``, ...); ``record``: what the round record
    keeps of it under ``selection`` (its knobs' values this round, the candidates it asked),
    or None to keep nothing."""

    indices: NDArray[np.int64]
    how: str
    record: dict[str, Any] | None = None


@dataclass(frozen=True)
class Seen:
    """What a round showed a selector, after the guards: the accepted replies, aligned.

    Attributes
    ----------
    server_round : int
    clients : tuple of str
        The client ids of the accepted updates.
    phi : ndarray or None
        Their contributions on the valuation's scale; None when the round was not valued
        (no usable update).
    replies : tuple of RecordDict
        Their reply contents as sent: the metrics a selector asked for in
        :meth:`Selector.train_config`, and the arrays before any guard touched them.
    states : tuple of mapping
        Their models as the guards left them, i.e. as averaged (``state - global_state`` is
        the update; a norm cap rescales it).
    global_state : mapping
        The model they trained from.
    record : mapping
        The round record (``fedowen_strategy.round.round_record``).
    """

    server_round: int
    clients: tuple[str, ...]
    phi: NDArray[np.float64] | None
    replies: tuple[RecordDict, ...] = ()
    states: tuple[Mapping[str, NDArray[Any]], ...] = ()
    global_state: Mapping[str, NDArray[Any]] | None = None
    record: Mapping[str, Any] | None = None


class Selector(Protocol):
    """One client selector over one run (module docstring). Subclass it: the optional
    methods' bodies below are the defaults (ask nothing more of trained clients, learn
    nothing, leave the weights, keep no state)."""

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """``pool.k`` of ``pool.keys``, drawn with ``rng`` only (the run's selection
        stream); ``ask`` reaches clients of the pool before the choice."""
        ...

    def train_config(self) -> dict[str, ConfigValue]:
        """Fields added to the chosen clients' train config (what the selector asks them to
        report in their reply)."""
        return {}

    def observe(self, seen: Seen) -> None:
        """Learn from the round that followed the choice."""
        return None

    def weigh(self, clients: Sequence[str], weights: NDArray[np.float64]
              ) -> NDArray[np.float64]:
        """The aggregation weights of the round's accepted updates (``clients``, aligned),
        given the valuation's; they must sum to 1 unless :meth:`step_weights`. Default: the
        valuation's."""
        return weights

    def step_weights(self) -> bool:
        """Whether :meth:`weigh`'s weights are a step from the global model: the round's
        model is then ``global + sum_i w_i (state_i - global)`` and the weights need not sum
        to 1 (the global model keeps the rest: an unbiased importance-weighted estimator).
        Default: False, an average."""
        return False

    def state(self) -> dict[str, Any]:
        """The selector's memory, JSON-able, for a checkpoint."""
        return {}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` (a checkpoint's)."""
        return None


@dataclass(frozen=True)
class SelectorSettings(Settings):
    """Base of a selector's settings: a frozen dataclass whose fields declare its run-config
    keys (:func:`fedowen_task.declare.key`) and whose ``problems()`` holds their rules."""

    #: The selector's name in ``SELECTORS`` (set by each settings type).
    selector: ClassVar[str] = ""

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """No keys, no problems (a selector with keys lists its own)."""
        return []

    def round_problems(self, k: int, keys: Keys = NO_KEYS) -> list[str]:
        """Problems of these settings with ``k`` clients a round (none by default)."""
        return []

    def for_run(self, num_rounds: int) -> SelectorSettings:
        """These settings for a run of ``num_rounds`` rounds: a key whose default is the
        run's length resolves here (unchanged by default)."""
        return self

    def model_problems(self, state: Mapping[str, NDArray[Any]], num_classes: int,
                       keys: Keys = NO_KEYS) -> list[str]:
        """Problems of these settings with the run's model, checked before the first round:
        ``state`` its arrays by name (in the model's order), ``num_classes`` the dataset's
        classes (none by default; a selector that reads a layer of the model checks it is
        there)."""
        return []


def metric_of(content: RecordDict, name: str) -> float:
    """A reply's float metric ``name`` (NaN when missing or not a number): how a selector
    reads what it asked a client for."""
    for record in content.metric_records.values():
        value = record.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return float("nan")
