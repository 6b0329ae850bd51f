"""Exclusion after a resolved negative contribution: around any selector (issue 72, Deliver 4).

The valuation sees backdoor clients as poor contributors, yet neither the softmax weights nor
the bandit act on it. :class:`Excluding` wraps a run's selector (``exclusion-level > 0``;
:func:`fedowen_strategy.selectors.registry.selection` builds it) and acts on the valuation's
verdict across rounds:

- **the test** is the screened selector's (:func:`~fedowen_strategy.selectors.screened.
  resolved_harmful`): a client is resolved harmful once its mean phi over the rounds it was
  valued in is below 0 by a one-sided z test, its variance the within-client variance pooled
  over every valued client, the level ``exclusion-level`` split over the client's looks
  (``level / (n (n + 1))`` at its n-th valued round), after at least ``exclusion-min-rounds``
  of them: a client whose true mean phi is 0 is excluded at some round of a run with
  probability at most the level (a union bound over its looks);
- **what follows**: it is excluded for the rest of the run (nothing would bring new evidence:
  it is not drawn again), out of the pool the wrapped selector chooses from, unless fewer than
  ``k`` of the pool would be left (they then fill the round), and its weight is 0 in any round
  it is in (the others' renormalised, unless the selector's weights are a step); it is still
  valued there, as a player of the round's game.

The wrapped selector sees only the clients it may choose (its ``ask`` reaches them by their
place in that pool) and learns from every round as before. Its book (each client's count, mean
and squared deviations of phi) and who was excluded when are checkpointed beside the wrapped
selector's own state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    ConfigValue,
    Pool,
    Seen,
    Selector,
)
from fedowen_strategy.selectors.posterior import Book, add_rewards, book_arrays, load_book
from fedowen_strategy.selectors.screened import resolved_harmful

if TYPE_CHECKING:
    from flwr.app import RecordDict

log = logging.getLogger(__name__)


class Excluding(Selector):
    """``selector`` without the clients resolved harmful (module docstring): ``level`` the
    test's one-sided level over a run, ``min_rounds`` the valued rounds a client needs before
    it is tested."""

    def __init__(self, selector: Selector, level: float, min_rounds: int = 2) -> None:
        if not 0.0 < level < 1.0 or min_rounds < 2:
            raise ValueError(f"exclusion needs 0 < level < 1 and min_rounds >= 2, got "
                             f"level={level!r}, min_rounds={min_rounds!r}")
        self.selector, self.level, self.min_rounds = selector, level, min_rounds
        self.book: Book = {}
        self.excluded: dict[str, int] = {}  # client -> the round whose phi resolved it

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """The wrapped selector's choice among the pool's clients not excluded (all of the
        pool when fewer than ``k`` are); its record adds ``excluded``, the ids excluded so
        far."""
        kept = np.array([c not in self.excluded for c in pool.keys], dtype=bool)
        among = np.flatnonzero(kept) if kept.sum() >= pool.k else np.arange(len(pool.keys))
        arms = None if pool.arms is None else pool.arms[among]
        if arms is not None and np.unique(arms).size == arms.size:
            arms = None  # no two of the kept share an arm
        sub = Pool(tuple(pool.keys[i] for i in among.tolist()), pool.k, pool.server_round, arms)

        def ask_among(indices: Sequence[int], config: Mapping[str, ConfigValue],
                      with_model: bool = True) -> list[RecordDict | None]:
            return ask([int(among[i]) for i in indices], config, with_model)

        choice = self.selector.choose(sub, rng, ask_among)
        picked = np.sort(among[np.asarray(choice.indices, dtype=np.int64)])
        record = {**(choice.record or {}), "excluded": sorted(self.excluded)}
        return Choice(picked, choice.how, record)

    def train_config(self) -> dict[str, ConfigValue]:
        """The wrapped selector's."""
        return self.selector.train_config()

    def observe(self, seen: Seen) -> None:
        """Show the wrapped selector the round, add each valued client's phi to the book and
        exclude the clients it now resolves harmful."""
        self.selector.observe(seen)
        if seen.phi is None or not seen.clients:
            return
        add_rewards(self.book, seen.clients, np.asarray(seen.phi, dtype=np.float64))
        ids = sorted(self.book)
        harmful = resolved_harmful(*book_arrays(self.book, ids), self.level, self.min_rounds)
        for cid in (c for c, h in zip(ids, harmful, strict=True) if h):
            if cid not in self.excluded:
                self.excluded[cid] = seen.server_round
                n, mean = self.book[cid][0], self.book[cid][1]
                log.info("round %d: client %s excluded (mean phi %.4g over %d valued "
                         "rounds resolved below 0 at level %g)", seen.server_round, cid, mean,
                         int(n), self.level)

    def weigh(self, clients: Sequence[str], weights: NDArray[np.float64]
              ) -> NDArray[np.float64]:
        """The wrapped selector's weights, the excluded clients' set to 0 (and the rest
        renormalised to sum to what they summed to, unless they are a step); unchanged when
        every client of the round is excluded (nobody else to weigh)."""
        weights = np.asarray(self.selector.weigh(clients, weights), dtype=np.float64)
        out = zero_excluded(weights, [c in self.excluded for c in clients],
                            renormalise=not self.selector.step_weights())
        if out is None:
            log.warning("every update of the round is from an excluded client (%s): their "
                        "weights are kept", ", ".join(clients))
            return weights
        return out

    def step_weights(self) -> bool:
        """The wrapped selector's."""
        return self.selector.step_weights()

    def state(self) -> dict[str, Any]:
        """The wrapped selector's memory, the book and who was excluded when."""
        return {"inner": self.selector.state(), "book": dict(self.book),
                "excluded": dict(self.excluded)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`; a checkpoint made without exclusion is the wrapped
        selector's alone (the book then starts empty)."""
        if "inner" not in state:
            self.selector.load(state)
            self.book, self.excluded = {}, {}
            return
        self.selector.load(state["inner"])
        self.book = load_book({"rewards": state.get("book", {})})
        self.excluded = {str(c): int(r) for c, r in state.get("excluded", {}).items()}


def zero_excluded(weights: NDArray[np.float64], excluded: Sequence[bool],
                  renormalise: bool = True) -> NDArray[np.float64] | None:
    """``weights`` with the ``excluded`` entries 0; with ``renormalise`` the others scaled to
    the weights' old sum. None when every entry is excluded, or the others weigh nothing."""
    weights = np.asarray(weights, dtype=np.float64)
    drop = np.asarray(excluded, dtype=bool)
    if drop.size != weights.size:
        raise ValueError(f"got {weights.size} weights but {drop.size} exclusion flags")
    if not drop.any():
        return weights
    out = np.where(drop, 0.0, weights)
    if not renormalise:
        return out if not drop.all() else None
    rest = float(out.sum())
    if drop.all() or rest <= 0.0:
        return None
    return out * (float(weights.sum()) / rest)
