"""``power-of-choice``: Power-of-Choice (Cho, Wang, Joshi, AISTATS 2022, ``pow-d``).

Ask ``d > k`` candidates for their local loss on the current global model and keep the ``k``
with the highest loss. The ask is a ``query`` message carrying the global model and
``local-loss`` (the ClientApp answers with its partition's mean loss and size); the round
record keeps the candidates, their losses, the messages and the examples they evaluated.
Simplified: the candidates are drawn uniformly (the paper draws them in proportion to their
data fraction, which the server does not know before it has asked them); each candidate
evaluates its whole partition (the paper's ``pow-d``, not the mini-batch ``cpow-d``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    Pool,
    Selector,
    SelectorSettings,
    metric_of,
)
from fedowen_strategy.selectors.shared import select_uniform
from fedowen_strategy.settings import NO_KEYS, Keys, key
from fedowen_task import declare
from fedowen_task.protocol import LOCAL_LOSS_FIELD, NUM_EXAMPLES_FIELD


@dataclass(frozen=True)
class PowerOfChoiceSettings(SelectorSettings):
    """Power-of-Choice's key: ``poc_d`` candidates a round (d >= k; more than the clients:
    all of them)."""

    selector: ClassVar[str] = "power-of-choice"
    poc_d: int = declare.key(20, "Power-of-Choice's candidates a round", name="poc-d")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings."""
        return [] if self.poc_d >= 1 else [
            f"{key(keys, 'poc_d')}={self.poc_d!r} must be >= 1 (and >= k)"]

    def round_problems(self, k: int, keys: Keys = NO_KEYS) -> list[str]:
        """``d`` below ``k``: nothing to keep k of."""
        if self.poc_d >= k:
            return []
        return [f"{key(keys, 'poc_d')}={self.poc_d} must be >= "
                f"{key(keys, 'clients_per_round')}={k}: "
                "Power-of-Choice keeps k of d candidates"]


class PowerOfChoice(Selector):
    """Asks ``d`` uniformly drawn candidates for their loss, keeps the ``k`` highest."""

    def __init__(self, settings: PowerOfChoiceSettings) -> None:
        self.settings = settings

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """The ``k`` candidates of highest local loss (:func:`keep_highest`)."""
        n = len(pool.keys)
        candidates = select_uniform(n, min(max(self.settings.poc_d, pool.k), n), rng)
        replies = ask(candidates.tolist(), {LOCAL_LOSS_FIELD: 1})
        losses = np.array([float("nan") if c is None else metric_of(c, LOCAL_LOSS_FIELD)
                           for c in replies])
        examples = [metric_of(c, NUM_EXAMPLES_FIELD) for c in replies if c is not None]
        kept = candidates[keep_highest(losses, pool.k)]
        return Choice(kept, "power-of-choice", {
            "candidates": [pool.keys[i] for i in candidates.tolist()],
            "candidate_losses": [None if np.isnan(v) else float(v) for v in losses],
            "query_examples": int(sum(n for n in examples if np.isfinite(n)))})


def keep_highest(losses: NDArray[np.float64], k: int) -> NDArray[np.int64]:
    """Power-of-Choice's cut: positions of the ``k`` highest losses (ties: the earlier
    position; NaN losses count as lowest), sorted."""
    losses = np.asarray(losses, dtype=np.float64)
    if not 1 <= k <= losses.size:
        raise ValueError(f"cannot keep k={k} of {losses.size} candidates; need 1 <= k <= d")
    key = np.where(np.isnan(losses), -np.inf, losses)
    order = np.lexsort((np.arange(key.size), -key))  # highest first, earlier first on ties
    return np.sort(order[:k])
