"""``greedyfed``: GreedyFed (Singhal, Pandey, Popovski, IEEE Networking Letters 2024; public
code pringlesinghal/GreedyFed).

Round-robin start, then greedy: while some client of the pool has never been valued, the
never-valued ones are taken in id order, the round filled up uniformly from the valued ones
(GreedyFed's last warm-up round); once every client of the pool has a value, the ``k`` of
highest value, ties broken at random (the reference's ``topk``: a random permutation, then the
largest). A client's value is its cumulative contribution: the first phi it is given, then
the running mean of its phi (``greedyfed-memory = "mean"``) or ``m old + (1 - m) phi`` (a float
``m``: the reference's sweep 0, 0.1, 0.5, 0.9). Only the round's valued clients are updated;
an absent client keeps its value (the reference's stale values, no decay).

Its phi is the configured valuation's (``Seen.phi``): with ``valuation = "gtg-greedyfed"``,
``game = "average"``, ``phi-scale = "raw"`` and ``aggregation = "examples"`` this is GreedyFed
as published (GTG-Shapley of ``1 - CE`` on the server's set over FedAvg coalitions, FedAvg
weights); with FedOwen's default valuation it is GreedyFed on FedOwen's phi.

Simplified or decided here: the warm-up lasts the paper's ``ceil(N / k)`` rounds (the code's
``floor(N / k) + 1`` adds a round of random clients when ``k`` divides ``N``), counted over the
clients the pool offers, so a client that joins late, or whose round was not valued, goes
through the same path; a round the valuation does not value (``phi`` None) changes nothing.
The reference's greedy loop (``greedy_shap_run``) was not retrievable: its memory forms and
the first value (the reference starts from 0, so its float-``m`` values start at
``(1 - m) phi``) are reconstructed from ``ucb_run`` and the paper's summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    Pool,
    Seen,
    Selector,
    SelectorSettings,
)
from fedowen_strategy.settings import NO_KEYS, Keys, key
from fedowen_task import declare


@dataclass(frozen=True)
class GreedyFedSettings(SelectorSettings):
    """GreedyFed's key: how a client's phi accumulate (``mean`` or a float ``m`` in [0, 1])."""

    selector: ClassVar[str] = "greedyfed"
    greedyfed_memory: str = declare.key(
        "mean", "GreedyFed's cumulative value: mean | m in [0, 1] (m old + (1 - m) new)",
        name="greedyfed-memory")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings."""
        try:
            memory_weight(self.greedyfed_memory)
        except ValueError as err:
            return [f"{key(keys, 'greedyfed_memory')}={self.greedyfed_memory!r}: {err}"]
        return []


class GreedyFed(Selector):
    """Round-robin until every client of the pool has a value, then the ``k`` of highest
    cumulative value. Its round record (``selection``): ``how`` (the phase) and ``unvalued``
    (the pool's never-valued clients); it reads the valuation's phi, not the clients."""

    def __init__(self, settings: GreedyFedSettings) -> None:
        self.settings = settings
        self.memory = memory_weight(settings.greedyfed_memory)
        self.values: dict[str, float] = {}  # client -> cumulative value
        self.counts: dict[str, int] = {}  # client -> rounds valued

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """:func:`round_robin` while a client of the pool has no value, else :func:`top_k`."""
        valued = np.array([c in self.values for c in pool.keys])
        if valued.all():
            how = "greedy"
            picked = top_k(np.array([self.values[c] for c in pool.keys]), pool.k, rng)
        else:
            how = "round-robin"
            picked = round_robin(valued, pool.k, rng)
        return Choice(picked, how, {"unvalued": int((~valued).sum())})

    def observe(self, seen: Seen) -> None:
        """Each valued client's cumulative value (:func:`accumulate`); nothing when the
        round was not valued or a phi is not finite."""
        if seen.phi is not None:
            for cid, phi in zip(seen.clients, seen.phi.tolist(), strict=True):
                if math.isfinite(phi):
                    self.values[cid] = accumulate(self.values.get(cid), self.counts.get(cid, 0),
                                                  phi, self.memory)
                    self.counts[cid] = self.counts.get(cid, 0) + 1

    def state(self) -> dict[str, Any]:
        """Each client's cumulative value and the rounds it was valued."""
        return {"values": dict(self.values), "counts": dict(self.counts)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.values = {str(c): float(v) for c, v in state.get("values", {}).items()}
        self.counts = {str(c): int(n) for c, n in state.get("counts", {}).items()}


def memory_weight(memory: str) -> float | None:
    """``greedyfed-memory`` as the old value's weight ``m`` (None for ``mean``).

    Raises
    ------
    ValueError
        For anything but ``mean`` or a number in [0, 1].
    """
    if memory == "mean":
        return None
    try:
        m = float(memory)
    except ValueError:
        m = float("nan")
    if not 0.0 <= m <= 1.0:
        raise ValueError("must be 'mean' or a number m in [0, 1] (the old value's weight; "
                         "the reference swept 0, 0.1, 0.5, 0.9)")
    return m


def accumulate(old: float | None, count: int, phi: float, memory: float | None) -> float:
    """A client's cumulative value after one more ``phi``: ``phi`` itself the first time
    (``old`` None), then the running mean over ``count + 1`` values (``memory`` None) or
    ``memory * old + (1 - memory) * phi``."""
    if old is None:
        return phi
    if memory is None:
        return (count * old + phi) / (count + 1)
    return memory * old + (1.0 - memory) * phi


def round_robin(valued: NDArray[np.bool_], k: int, rng: np.random.Generator
                ) -> NDArray[np.int64]:
    """GreedyFed's warm-up pick: the first ``k`` never-valued positions, filled up uniformly
    without replacement from the valued ones; sorted."""
    valued = np.asarray(valued, dtype=bool)
    if not 1 <= k <= valued.size:
        raise ValueError(f"cannot select k={k} clients out of {valued.size}")
    picked = np.flatnonzero(~valued)[:k]
    if picked.size < k:
        fill = rng.choice(np.flatnonzero(valued), size=k - picked.size, replace=False)
        picked = np.r_[picked, fill]
    return np.sort(picked.astype(np.int64))


def top_k(values: NDArray[np.float64], k: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """Positions of the ``k`` largest ``values``, ties broken uniformly at random (the
    reference's ``topk``: the values in a random order, then the largest); sorted."""
    values = np.asarray(values, dtype=np.float64)
    if not 1 <= k <= values.size:
        raise ValueError(f"cannot select k={k} clients out of {values.size}")
    order = rng.permutation(values.size)
    order = order[np.argsort(-values[order], kind="stable")]
    return np.sort(order[:k].astype(np.int64))
