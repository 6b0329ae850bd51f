"""``oort``: Oort (Lai et al., OSDI 2021), as in FedScale's reference code (SymbioticLab/Oort).

A client's statistical utility ``|B_i| sqrt(mean of its squared per-sample training losses)``,
reported after it trained (the train config asks for ``loss-squares``), plus the staleness
bonus ``sqrt(0.1 log t / L_i)`` (``L_i`` the round it last took part); ``(1 - eps) k`` clients
exploited among the explored ones (the top list cut at 95% of the ``(1 - eps) k``-th score,
sampled in proportion to score), the rest explored among clients never tried; ``eps`` decays
from 0.9 by 0.98 a round to a floor (``oort-exploration-min``). Utilities are clipped at their
98th percentile. Simplified away: the pacer and the system utility (every simulated client here
is equally fast, so the preferred round duration never binds) and the blacklist (off by default
there too); unexplored clients are explored uniformly (the reference ranks them by speed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    ConfigValue,
    Pool,
    Seen,
    Selector,
    SelectorSettings,
    metric_of,
)
from fedowen_strategy.settings import NO_KEYS, Keys, key
from fedowen_task import declare
from fedowen_task.protocol import LOSS_SQUARES_FIELD, NUM_EXAMPLES_FIELD

if TYPE_CHECKING:
    from flwr.app import RecordDict

#: Oort's constants (FedScale's defaults): initial exploration, decay per round, the cut-off
#: on the exploited list (a share of the (1 - eps) k-th score), the clip of the utilities.
OORT_EXPLORATION, OORT_DECAY, OORT_CUT_OFF, OORT_CLIP = 0.9, 0.98, 0.95, 0.98


@dataclass(frozen=True)
class OortSettings(SelectorSettings):
    """Oort's key: the floor on its decaying exploration share, in [0, 1]."""

    selector: ClassVar[str] = "oort"
    oort_exploration_min: float = declare.key(
        0.3, "Oort's floor on its exploration share", name="oort-exploration-min")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings."""
        if 0.0 <= self.oort_exploration_min <= 1.0:
            return []
        return [f"{key(keys, 'oort_exploration_min')}={self.oort_exploration_min!r} must lie "
                "in [0, 1]"]


class Oort(Selector):
    """Oort's pick from each client's latest utility and the round it was seen; asks the
    trained clients for their squared losses; records the round's exploration share."""

    def __init__(self, settings: OortSettings) -> None:
        self.settings = settings
        self.oort: dict[str, list[float]] = {}  # client -> [utility, last round]

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """:func:`oort_select` at this round's exploration share."""
        book = np.array([self.oort.get(c, [0.0, 0.0]) for c in pool.keys]).reshape(-1, 2)
        eps = oort_exploration(pool.server_round, self.settings.oort_exploration_min)
        picked = oort_select(book[:, 0], book[:, 1].astype(np.int64), pool.server_round,
                             pool.k, eps, rng)
        return Choice(picked, "oort", {"oort_exploration": eps})

    def train_config(self) -> dict[str, ConfigValue]:
        """Each trained client reports the sum of its squared per-sample losses."""
        return {LOSS_SQUARES_FIELD: 1}

    def observe(self, seen: Seen) -> None:
        """Each trained client's utility of this round (:func:`oort_utilities`)."""
        for cid, u in zip(seen.clients, oort_utilities(seen.replies), strict=True):
            self.oort[cid] = [float(u), float(seen.server_round)]

    def state(self) -> dict[str, Any]:
        """Each client's latest utility and the round it was seen."""
        return {"oort": dict(self.oort)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.oort = {str(c): [float(x) for x in v] for c, v in state.get("oort", {}).items()}


def oort_utilities(contents: Iterable[RecordDict]) -> list[float]:
    """Oort's statistical utility of each reply (``num-examples`` and the sum of squared
    training losses it reports; 0 where either is missing)."""
    out = []
    for content in contents:
        n, squares = metric_of(content, NUM_EXAMPLES_FIELD), metric_of(content, LOSS_SQUARES_FIELD)
        ok = np.isfinite(n) and np.isfinite(squares)
        out.append(oort_utility(n, squares) if ok else 0.0)
    return out


def oort_utility(num_examples: float, squared_loss_sum: float) -> float:
    """Oort's statistical utility ``|B| sqrt(sum(loss^2) / |B|)`` of one client's round."""
    if num_examples <= 0:
        return 0.0
    return float(num_examples * math.sqrt(max(squared_loss_sum, 0.0) / num_examples))


def oort_select(utility: NDArray[np.float64], last_round: NDArray[np.int64], t: int, k: int,
                exploration: float, rng: np.random.Generator) -> NDArray[np.int64]:
    """Oort's pick of ``k`` of ``n`` clients in round ``t`` (FedScale's ``getTopK`` less the
    pacer; module docstring). ``last_round[i]`` is 0 for a client never tried (``utility``
    then ignored), else the round of its latest utility; ``exploration`` is this round's eps."""
    utility = np.asarray(utility, dtype=np.float64)
    last_round = np.asarray(last_round)
    n = utility.size
    if not 1 <= k <= n:
        raise ValueError(f"cannot select k={k} clients out of {n}; need 1 <= k <= {n}")
    explored = np.flatnonzero(last_round > 0)
    unexplored = np.flatnonzero(last_round <= 0)
    picks: list[int] = []
    exploit = min(int(k * (1.0 - exploration)), explored.size - 1)
    if exploit > 0:
        score = oort_scores(utility[explored], last_round[explored], t)
        order = np.argsort(-score, kind="stable")
        cut = score[order[exploit]] * OORT_CUT_OFF
        top = order[score[order] >= cut]
        p = score[top] / score[top].sum() if score[top].sum() > 0 else None
        picks += [int(explored[i]) for i in rng.choice(top, size=exploit, replace=False, p=p)]
    explore = min(unexplored.size, k - len(picks))
    if explore > 0:
        picks += [int(i) for i in rng.choice(unexplored, size=explore, replace=False)]
    if len(picks) < k:  # Oort's fill: uniformly from the rest
        rest = np.setdiff1d(np.arange(n), picks)
        picks += [int(i) for i in rng.choice(rest, size=k - len(picks), replace=False)]
    return np.sort(np.array(picks, dtype=np.int64))


def oort_scores(utility: NDArray[np.float64], last_round: NDArray[np.int64], t: int
                ) -> NDArray[np.float64]:
    """Explored clients' Oort scores: the utility clipped at its 98th percentile and scaled to
    [0, 1] by the explored clients' range, plus ``sqrt(0.1 ln t / L_i)``."""
    values = np.sort(utility)
    clip = values[min(int(values.size * OORT_CLIP), values.size - 1)]
    low = values[0] * 0.999
    span = max(values[-1] - low, 1e-4)
    bonus = np.sqrt(0.1 * math.log(max(t, 1)) / np.maximum(last_round, 1))
    return (np.minimum(utility, clip) - low) / span + bonus


def oort_exploration(t: int, floor: float) -> float:
    """Oort's eps in round ``t`` (the first decay applies in round 1)."""
    return max(OORT_EXPLORATION * OORT_DECAY ** max(t, 1), floor)
