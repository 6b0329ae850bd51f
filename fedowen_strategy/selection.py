"""Hybrid epsilon-greedy bandit client selection (FedOwen paper, Algorithm 2).

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
function of its inputs and an explicit ``numpy.random.Generator``; the strategy keeps the
state.

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
from dataclasses import dataclass
from functools import partial

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.selectors import REWARDS
from fedowen_strategy.settings import NO_KEYS, Keys, Settings, key, one_of
from fedowen_task import declare

#: Algorithm 2's bandit, uniform sampling (FedAvg's, and the paper's ablation), the field's
#: selectors and FedOwen's posterior and screened selectors (:mod:`fedowen_strategy.selectors`).
SELECTIONS = ("adaptive", "random", "posterior", "screened", "power-of-choice", "oort")
#: Selectors that rank clients by phi, so need a valuation method that computes it.
NEEDS_PHI_SELECTIONS = ("adaptive", "posterior", "screened")
#: ``selection-cap``'s default: each selector's own identity cap (:func:`resolve_cap`).
AUTO_CAP = -1.0
#: The identity cap a selector runs with by default: the posterior selector was developed and
#: measured with 3 (conf/selection-dev.toml); every other selector runs as published (off).
DEFAULT_CAPS = {"posterior": 3.0}
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
class SelectionParams(Settings):
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
        Factor on the bonus of clients below the floor (paper: 0.1).
    memory, discount : str, float
        What the bandit exploits per client: the running mean of its phi (``mean``, the
        default), its latest phi (``latest``, Algorithm 2) or a discounted mean
        (``discounted``, weight ``discount`` on the newest phi): :func:`update_memory`.
    link_memory : int
        Clients whose updates were linked (near-parallel, ``link-cosine``) in at least this
        many rounds are one arm from then on: at most one of them is selected in a round,
        with one client's chance between them (0, the default: off). Against colluding
        Sybils, whose k identities are otherwise selected about k times as often as one.
    poc_d : int
        Power-of-Choice's candidates a round (d >= k; more than the clients: all of them).
    oort_exploration_min : float
        Oort's floor on its decaying exploration share, in [0, 1].
    reward : {"rank", "phi"}
        What the posterior selector learns from (:mod:`~fedowen_strategy.selectors`); the
        screened selector always learns from phi (0 is its threshold).
    resolve_level : float
        The posterior selector exploits only while one-way ANOVA rejects "every client's
        true reward is the same" at this level; otherwise it draws uniformly. The screened
        selector's one-sided level for "this client's mean phi is below 0".
    cap : float
        Identity cap, any selector: a client (or a lasting link group) selected ``cap`` times
        its uniform share so far sits a round out (0: off; else >= 1). The default,
        :data:`AUTO_CAP`, is the selector's own (:func:`resolve_cap`).
    """

    epsilon: float = declare.key(0.1, "Algorithm 2's exploration share", name="epsilon")
    c: float = declare.key(0.1, "Algorithm 2's exploration bonus", name="ucb-c")
    tau: float = declare.key(0.01, "the contribution floor of Algorithm 2", name="tau")
    low_gain_scale: float = 0.1
    memory: str = declare.key(
        "mean", "what the bandit exploits: mean | latest | discounted", name="bandit-memory")
    discount: float = declare.key(
        0.3, "the newest phi's weight (bandit-memory = discounted)", name="bandit-discount")
    link_memory: int = declare.key(
        0, "rounds linked before clients are one arm (0: off)", name="link-memory")
    poc_d: int = declare.key(20, "Power-of-Choice's candidates a round", name="poc-d")
    oort_exploration_min: float = declare.key(
        0.3, "Oort's floor on its exploration share", name="oort-exploration-min")
    reward: str = declare.key(
        "rank", "the posterior selector's reward: rank | phi", name="selection-reward")
    resolve_level: float = declare.key(
        0.01, "the posterior selector's ANOVA level", name="selection-level")
    cap: float = declare.key(
        AUTO_CAP, "selections beyond cap x a uniform share sit out (0: off; -1: the selector's "
        "own)", name="selection-cap")

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
            (self.link_memory >= 0,
             f"{k('link_memory')}={self.link_memory!r} must be >= 0 (rounds; 0 = off)"),
            (self.poc_d >= 1, f"{k('poc_d')}={self.poc_d!r} must be >= 1 (and >= k)"),
            (0.0 <= self.oort_exploration_min <= 1.0,
             f"{k('oort_exploration_min')}={self.oort_exploration_min!r} must lie in [0, 1]"),
            (0.0 < self.resolve_level <= 1.0,
             f"{k('resolve_level')}={self.resolve_level!r} must lie in (0, 1]"),
            (self.cap in (0.0, AUTO_CAP) or 1.0 <= self.cap < math.inf,
             f"{k('cap')}={self.cap!r} must be 0 (off), {AUTO_CAP:g} (the selector's own) or "
             "a finite number >= 1"),
        ]
        return ([message for ok, message in checks if not ok]
                + one_of(k("memory"), self.memory, MEMORIES)
                + one_of(k("reward"), self.reward, REWARDS))


def resolve_cap(selection: str, cap: float) -> float:
    """The identity cap ``selection`` runs with: ``cap``, unless it is :data:`AUTO_CAP`, then
    the selector's own (:data:`DEFAULT_CAPS`; off for the others)."""
    return DEFAULT_CAPS.get(selection, 0.0) if cap == AUTO_CAP else cap


def selection_scores(
    phi: NDArray[np.float64], counts: NDArray[np.int64], t: int, params: SelectionParams
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
                   params: SelectionParams) -> float:
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
    params: SelectionParams,
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
                 params: SelectionParams, rng: np.random.Generator, arm_of: NDArray[np.int64]
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


def round_size(num_clients: int, clients_per_round: int | None, fraction_train: float,
               min_train: int) -> int:
    """k for a round with ``num_clients`` selectable clients: ``clients_per_round``, else
    Flower FedAvg's rule ``max(int(n * fraction_train), min_train)``; never more than n."""
    if clients_per_round is not None:
        return min(clients_per_round, num_clients)
    return min(max(int(num_clients * fraction_train), min_train), num_clients)


def select_uniform(n: int, k: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """Plain uniform selection (FedAvg, and the paper's random-selection ablation)."""
    if not 1 <= k <= n:
        raise ValueError(f"cannot select k={k} clients out of {n}; need 1 <= k <= {n}")
    return np.sort(rng.choice(n, size=k, replace=False))
