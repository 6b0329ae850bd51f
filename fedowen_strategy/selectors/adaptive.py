"""``adaptive``: hybrid epsilon-greedy bandit client selection (FedOwen paper, Algorithm 2).

With probability ``epsilon`` the server explores: ``k`` clients drawn uniformly without
replacement. Otherwise it exploits: each client gets the score

    s_i = g_i + u_i,   g_i = phi_i if phi_i >= tau else 0,
    u_i = c * sqrt(ln(t + 1) / (sigma_i + 1))   (times ``low_gain_scale`` = 0.1 if phi_i < tau)

the scores are shifted by their minimum, normalised to probabilities (uniform when all are
zero) and ``k`` clients are drawn without replacement with those weights.

``phi_i`` is the client's latest contribution, ``sigma_i`` how often it was selected (and
returned an update), ``t`` the round. A client never valued (``sigma_i = 0``) has no phi yet
and is never below the floor: with a positive ``tau`` Algorithm 2 as written would cut the
bonus of every client not yet explored (their phi starts at 0). Everything here is a pure
function of its inputs and an explicit ``numpy.random.Generator``; :class:`Adaptive` keeps
each client's remembered phi and count (``bandit-memory``: :func:`update_memory`).

Defaults and their scale: FedOwen feeds ``phi`` on its ``phi-scale``, by default ``l1`` (a
round's absolute values sum to 1; :mod:`fedowen_strategy.round.contribution` owns the scale), so a
typical client in a round of 10 has phi ~ 0.1. ``c = 0.1`` makes the exploration bonus of a
client seen a few times (u ~ 0.05-0.1 at t ~ 50) comparable to one typical contribution, so
neither term drowns the other. ``tau = 0.01`` (1% of a round's total |phi|) is the paper's
"small floor": ``tau = 0`` penalises exactly the clients whose updates lowered the utility, but
a null player (phi exactly 0, e.g. a free rider in the delta game) then sits on the floor, not
below it, and keeps its whole bonus.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
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
from fedowen_strategy.settings import NO_KEYS, Keys, key, one_of
from fedowen_task import declare

#: What the bandit exploits: a client's latest phi (Algorithm 2), the running mean of its phi
#: over the rounds it was valued, or an exponentially discounted mean.
MEMORIES = ("latest", "mean", "discounted")


def update_memory(previous: float | None, phi: float, count: int, memory: str = "latest",
                  discount: float = 0.3) -> float:
    """A client's exploitation estimate after its ``count``-th valuation (count >= 1) gave
    ``phi``: ``latest`` -> phi; ``mean`` -> previous + (phi - previous) / count; ``discounted``
    -> (1 - discount) * previous + discount * phi (phi itself the first time)."""
    if memory not in MEMORIES:
        raise ValueError(f"bandit memory {memory!r} is not one of {MEMORIES}")
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount={discount!r} must lie in (0, 1]")
    if memory == "latest" or previous is None or count <= 1:
        return phi
    if memory == "mean":
        return previous + (phi - previous) / count
    return (1.0 - discount) * previous + discount * phi



@dataclass(frozen=True)
class AdaptiveSettings(SelectorSettings):
    """Constants of Algorithm 2 and the bandit's memory (defaults: the app's).

    Parameters
    ----------
    epsilon : float
        Exploration probability in [0, 1] (paper: 0.1).
    c : float
        Confidence weight of the exploration bonus, >= 0.
    tau : float
        Contribution floor: clients with phi < tau lose their gain and 90% of their bonus
        (paper: "a small floor"; 0.01 of a round's l1 scale here, docs/defaults.md).
    low_gain_scale : float
        Factor on the bonus of clients below the floor (paper: 0.1; no run-config key).
    memory, discount : str, float
        What the bandit exploits per client: the running mean of its phi (``mean``, the
        default), its latest phi (``latest``, Algorithm 2) or a discounted mean
        (``discounted``, weight ``discount`` on the newest phi): :func:`update_memory`.
    """

    selector: ClassVar[str] = "adaptive"
    epsilon: float = declare.key(0.1, "Algorithm 2's exploration share", name="epsilon")
    c: float = declare.key(0.1, "Algorithm 2's exploration bonus", name="ucb-c")
    tau: float = declare.key(0.01, "the contribution floor of Algorithm 2", name="tau")
    low_gain_scale: float = 0.1
    memory: str = declare.key(
        "mean", "what the bandit exploits: mean | latest | discounted", name="bandit-memory")
    discount: float = declare.key(
        0.3, "the newest phi's weight (bandit-memory = discounted)", name="bandit-discount")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these constants (:class:`~fedowen_strategy.settings.
        Settings`)."""
        k = partial(key, keys)
        checks = [
            (0.0 <= self.epsilon <= 1.0, f"{k('epsilon')}={self.epsilon!r} must lie in [0, 1]"),
            (0.0 <= self.c < math.inf, f"{k('c')}={self.c!r} must be a finite number >= 0"),
            (math.isfinite(self.tau), f"{k('tau')}={self.tau!r} must be finite"),
            (0.0 <= self.low_gain_scale <= 1.0,
             f"{k('low_gain_scale')}={self.low_gain_scale!r} must lie in [0, 1]"),
            (0.0 < self.discount <= 1.0, f"{k('discount')}={self.discount!r} must lie in (0, 1]"),
        ]
        return ([message for ok, message in checks if not ok]
                + one_of(k("memory"), self.memory, MEMORIES))


class Adaptive(Selector):
    """Algorithm 2 over each client's remembered phi and how often it was valued; clients of
    one lasting link group are one arm (:attr:`~fedowen_strategy.selectors.base.Pool.arms`).
    Chooses without asking clients; records nothing beyond the round's selection."""

    def __init__(self, settings: AdaptiveSettings) -> None:
        self.settings = settings
        self.phi: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """Algorithm 2's draw (:func:`select_clients`)."""
        phi = np.array([self.phi.get(c, 0.0) for c in pool.keys])
        counts = np.array([self.counts.get(c, 0) for c in pool.keys])
        picked, explored = select_clients(phi, counts, pool.server_round, pool.k,
                                          self.settings, rng, pool.arms)
        return Choice(picked, "explored" if explored else "exploited")

    def observe(self, seen: Seen) -> None:
        """Remember each valued client's phi (:func:`update_memory`) and count it."""
        if seen.phi is None:
            return
        for cid, value in zip(seen.clients, np.asarray(seen.phi, np.float64), strict=True):
            count = self.counts[cid] = self.counts.get(cid, 0) + 1
            self.phi[cid] = update_memory(self.phi.get(cid), float(value), count,
                                          self.settings.memory, self.settings.discount)

    def state(self) -> dict[str, Any]:
        """Each client's remembered phi and count."""
        return {"phi": dict(self.phi), "counts": dict(self.counts)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.phi = {str(c): float(v) for c, v in state.get("phi", {}).items()}
        self.counts = {str(c): int(n) for c, n in state.get("counts", {}).items()}


def selection_scores(
    phi: NDArray[np.float64], counts: NDArray[np.int64], t: int, params: AdaptiveSettings
) -> NDArray[np.float64]:
    """Exploitation scores ``s_i = g_i + u_i`` of Algorithm 2 (before shifting)."""
    phi = np.asarray(phi, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if phi.shape != counts.shape:
        raise ValueError(f"phi shape {phi.shape} and counts shape {counts.shape} differ")
    if np.any(counts < 0):
        raise ValueError(f"selection counts must be >= 0, got {counts.min()}")
    below = (phi < params.tau) & (counts > 0)
    gain = np.where(below, 0.0, phi)
    bonus = params.c * np.sqrt(np.log(t + 1.0) / (counts + 1.0))
    bonus = np.where(below, params.low_gain_scale * bonus, bonus)
    return gain + bonus


def unvalued_floor(scores: NDArray[np.float64], counts: NDArray[np.int64], t: int,
                   params: AdaptiveSettings) -> float:
    """What the shift by the minimum leaves a client never valued: 0 (Algorithm 2 as
    written), unless such a client holds the minimum score, which the shift would give
    probability 0 although nothing is known of it. Then every score keeps one exploration
    bonus of an unvalued client, ``c sqrt(log(t + 1))``, above the shifted minimum.

    This happens when every client valued so far scored above the floor ``tau``: in a small
    federation (8 nodes, 4 per round: the other 4 were never chosen again but by the epsilon
    draws); never in the 100-client runs checked (docs/defaults.md)."""
    counts = np.asarray(counts)
    lowest = scores == scores.min()
    if lowest.all() or not np.any(lowest & (counts == 0)):  # all equal: uniform already
        return 0.0
    return float(params.c * np.sqrt(np.log(t + 1.0)))


def selection_probabilities(scores: NDArray[np.float64], floor: float = 0.0
                            ) -> NDArray[np.float64]:
    """Shift scores by their minimum (less ``floor``) and normalise; uniform when all shifted
    scores are 0."""
    shifted = scores - scores.min() + floor
    total = shifted.sum()
    if total <= 0.0 or not np.isfinite(total):
        return np.full(scores.shape, 1.0 / scores.size)
    return shifted / total


def select_clients(
    phi: NDArray[np.float64],
    counts: NDArray[np.int64],
    t: int,
    k: int,
    params: AdaptiveSettings,
    rng: np.random.Generator,
    arm_of: NDArray[np.int64] | None = None,
) -> tuple[NDArray[np.int64], bool]:
    """Pick ``k`` distinct clients by Algorithm 2.

    ``arm_of`` (optional) maps each client to an arm: clients sharing an arm (a lasting link,
    :func:`fedowen_strategy.defences.links.lasting_groups`) are one arm of the bandit, whose phi is
    the mean of its valued members' and whose count is theirs summed; the arms are drawn by
    Algorithm 2 and each drawn arm sends one member, uniformly; when there are fewer arms
    than ``k`` the rest are drawn uniformly from the clients left.

    Returns
    -------
    (indices, explored)
        Indices into ``phi`` of the selected clients, and whether this was an exploration
        draw (uniform) rather than an exploitation draw.
    """
    n = len(phi)
    if not 1 <= k <= n:
        raise ValueError(f"cannot select k={k} clients out of {n}; need 1 <= k <= {n}")
    if arm_of is not None and len(np.unique(arm_of)) < n:
        return _select_arms(np.asarray(phi, np.float64), np.asarray(counts), t, k, params,
                            rng, np.asarray(arm_of))
    if rng.random() < params.epsilon:
        return np.sort(rng.choice(n, size=k, replace=False)), True
    scores = selection_scores(phi, counts, t, params)
    probs = selection_probabilities(scores, floor=unvalued_floor(scores, counts, t, params))
    # Fewer positive-probability clients than k: numpy refuses; top up uniformly from the rest.
    positive = np.flatnonzero(probs > 0)
    if positive.size >= k:
        return np.sort(rng.choice(n, size=k, replace=False, p=probs)), False
    rest = np.setdiff1d(np.arange(n), positive)
    extra = rng.choice(rest, size=k - positive.size, replace=False)
    return np.sort(np.concatenate([positive, extra])), False


def _select_arms(phi: NDArray[np.float64], counts: NDArray[np.int64], t: int, k: int,
                 params: AdaptiveSettings, rng: np.random.Generator, arm_of: NDArray[np.int64]
                 ) -> tuple[NDArray[np.int64], bool]:
    """:func:`select_clients` over arms that join several clients (see there; ``k`` checked
    there)."""
    n = len(phi)
    arms, arm_of = np.unique(arm_of, return_inverse=True)
    members = [np.flatnonzero(arm_of == a) for a in range(len(arms))]
    valued = counts > 0
    arm_phi = np.array([phi[m][valued[m]].mean() if valued[m].any() else 0.0 for m in members])
    arm_counts = np.array([counts[m].sum() for m in members])
    chosen, explored = select_clients(arm_phi, arm_counts, t, min(k, len(members)), params, rng)
    picks = [int(rng.choice(members[a])) for a in chosen]
    if len(picks) < k:
        rest = np.setdiff1d(np.arange(n), picks)
        picks += [int(i) for i in rng.choice(rest, size=k - len(picks), replace=False)]
    return np.sort(np.array(picks, dtype=np.int64)), explored

