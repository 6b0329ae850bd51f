"""``screened``: uniform among the clients not resolved as harmful (FedOwen's, issue 43).

A second candidate beside the posterior selector: uniform selection among the clients not
resolved as harmful, i.e. whose mean phi is not below 0 by a one-sided z test with the pooled
within-client variance, its level (``selection-level``) split over the client's looks (a false
screen is rare over a whole run). It exploits only resolved harm (an update that made the
server's loss worse, round after round), never a client's lead among helpful ones: where the
posterior candidates concentrate on the best-valued writers (FEMNIST: below random selection),
it stays uniform among them; a booster it does not prefer. Its reward is always phi (0 is its
threshold).
"""

from __future__ import annotations

import dataclasses
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
from fedowen_strategy.selectors.posterior import (
    Book,
    PosteriorSettings,
    add_rewards,
    book_arrays,
    load_book,
)
from fedowen_strategy.settings import NO_KEYS, Keys, key
from fedowen_task import declare


@dataclass(frozen=True)
class ScreenedSettings(SelectorSettings):
    """The screened selector's level: the posterior selector's key ``selection-level``
    (declared there), here the one-sided level of "this client's mean phi is below 0"."""

    selector: ClassVar[str] = "screened"
    resolve_level: float = dataclasses.field(
        default=PosteriorSettings.resolve_level, metadata=declare.named("selection-level"))

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings."""
        if 0.0 < self.resolve_level <= 1.0:
            return []
        return [f"{key(keys, 'resolve_level')}={self.resolve_level!r} must lie in (0, 1]"]


class Screened(Selector):
    """Uniform among the clients not resolved as harmful; records how many are screened."""

    def __init__(self, settings: ScreenedSettings) -> None:
        self.settings = settings
        self.rewards: Book = {}

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """Uniform among the unscreened; the screened fill up the round when fewer than ``k``
        are left."""
        harmful = resolved_harmful(*book_arrays(self.rewards, pool.keys),
                                   self.settings.resolve_level)
        kept = np.flatnonzero(~harmful)
        picks = rng.choice(kept, size=min(pool.k, kept.size), replace=False)
        if picks.size < pool.k:
            rest = np.flatnonzero(harmful)
            picks = np.concatenate([picks, rng.choice(rest, size=pool.k - picks.size,
                                                      replace=False)])
        return Choice(np.sort(picks.astype(np.int64)), "screened",
                      {"screened": int(harmful.sum())})

    def observe(self, seen: Seen) -> None:
        """Add each valued client's phi to its rewards."""
        if seen.phi is not None:
            add_rewards(self.rewards, seen.clients, np.asarray(seen.phi, dtype=np.float64))

    def state(self) -> dict[str, Any]:
        """Each client's phi statistics."""
        return {"rewards": dict(self.rewards)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.rewards = load_book(state)


def resolved_harmful(count: NDArray[np.int64], mean: NDArray[np.float64],
                     m2: NDArray[np.float64], level: float, min_count: int = 2
                     ) -> NDArray[np.bool_]:
    """Which clients' true mean reward is resolved below 0: ``mean + z sqrt(s2 / count) < 0``,
    ``s2`` the within-client variance pooled over every client rewarded (as in
    :func:`posterior`) and ``z`` the one-sided normal quantile at ``level / (count (count +
    1))``: the levels of a client's looks sum to ``level``, so a client whose true mean is 0
    is screened at some round of the run with probability at most ``level`` (a union bound
    over its looks; a screened client is not selected again, so a false screen would last).
    A client rewarded fewer than ``min_count`` times (at least twice) is never resolved (the
    exclusion of :mod:`fedowen_strategy.selectors.exclusion` reads the same test)."""
    from scipy.stats import norm

    count = np.asarray(count, dtype=np.float64)
    mean = np.asarray(mean, dtype=np.float64)
    seen = count > 0
    df = float((count[seen] - 1).sum())
    if df < 1:
        return np.zeros(count.size, dtype=bool)
    s2 = float(np.asarray(m2, dtype=np.float64)[seen].sum()) / df
    looks = np.maximum(count, 1.0)
    z = norm.isf(level / (looks * (looks + 1.0)))
    bound = mean + z * np.sqrt(max(s2, 0.0) / looks)
    return np.asarray((count >= max(min_count, 2)) & (bound < 0.0))
