"""``random``: k of the clients uniformly (FedAvg's selection, and the paper's ablation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    Pool,
    Selector,
    SelectorSettings,
)
from fedowen_strategy.selectors.shared import select_uniform


@dataclass(frozen=True)
class RandomSettings(SelectorSettings):
    """Uniform selection has no keys."""

    selector: ClassVar[str] = "random"


class Random(Selector):
    """``k`` of the pool uniformly; learns nothing, records nothing."""

    def __init__(self, settings: RandomSettings) -> None:
        self.settings = settings

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """:func:`~fedowen_strategy.selectors.shared.select_uniform`."""
        return Choice(select_uniform(len(pool.keys), pool.k, rng), "random")
