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
round's absolute values sum to 1; :mod:`fedowen_strategy.contribution` owns the scale), so a
typical client in a round of 10 has phi ~ 0.1. ``c = 0.1`` makes the exploration bonus of a
client seen a few times (u ~ 0.05-0.1 at t ~ 50) comparable to one typical contribution, so
neither term drowns the other. ``tau = 0.01`` (1% of a round's total |phi|) is the paper's
"small floor": ``tau = 0`` penalises exactly the clients whose updates lowered the utility, but
a null player (phi exactly 0, e.g. a free rider in the delta game) then sits on the floor, not
below it, and keeps its whole bonus.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.links import Pair, count_links, lasting_groups

#: Algorithm 2's bandit, or uniform sampling (FedAvg's, and the paper's ablation).
SELECTIONS = ("adaptive", "random")
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
class SelectionParams:
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
    """

    epsilon: float = 0.1
    c: float = 0.1
    tau: float = 0.01
    low_gain_scale: float = 0.1
    memory: str = "mean"
    discount: float = 0.3
    link_memory: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon={self.epsilon!r} must lie in [0, 1]")
        if self.c < 0.0 or not np.isfinite(self.c):
            raise ValueError(f"c={self.c!r} must be a finite number >= 0")
        if not np.isfinite(self.tau):
            raise ValueError(f"tau={self.tau!r} must be finite")
        if not 0.0 <= self.low_gain_scale <= 1.0:
            raise ValueError(f"low_gain_scale={self.low_gain_scale!r} must lie in [0, 1]")
        update_memory(None, 0.0, 1, self.memory, self.discount)  # validates both
        if self.link_memory < 0:
            raise ValueError(f"link_memory={self.link_memory!r} must be >= 0 (0 = off)")


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
    :func:`fedowen_strategy.links.lasting_groups`) are one arm of the bandit, whose phi is
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


@dataclass
class Bandit:
    """Algorithm 2's state over a run: each client's remembered phi and times valued, and the
    selection's random stream; ``mode`` ``random`` samples uniformly (FedAvg's selection)."""

    params: SelectionParams
    rng: np.random.Generator
    mode: str = "adaptive"
    phi: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    pair_links: dict[Pair, int] = field(default_factory=dict)

    def choose(self, keys: Sequence[str], server_round: int, k: int
               ) -> tuple[NDArray[np.int64], bool]:
        """Indices into ``keys`` of ``k`` clients, and whether the bandit explored."""
        if self.mode == "random":
            return select_uniform(len(keys), k, self.rng), True
        phi = np.array([self.phi.get(key, 0.0) for key in keys])
        counts = np.array([self.counts.get(key, 0) for key in keys])
        return select_clients(phi, counts, server_round, k, self.params, self.rng,
                              self.arms(keys))

    def arms(self, keys: Sequence[str]) -> NDArray[np.int64] | None:
        """Each key's arm (:attr:`SelectionParams.link_memory`'s lasting groups share one);
        None when no two keys share one."""
        groups = lasting_groups(self.pair_links, self.params.link_memory)
        if not groups:
            return None
        arm = {c: g[0] for g in groups for c in g}
        labels = [arm.get(key, key) for key in keys]
        if len(set(labels)) == len(labels):
            return None
        _, arm_of = np.unique(labels, return_inverse=True)
        return np.asarray(arm_of, dtype=np.int64)

    def observe_links(self, groups: Sequence[Sequence[str]]) -> None:
        """Count a round's linked groups (the round record's ``links``); only with
        ``link_memory``."""
        if self.params.link_memory and groups:
            self.pair_links = count_links(self.pair_links, groups)

    def observe(self, client_ids: Sequence[str], phi: Sequence[float] | NDArray[np.float64]
                ) -> None:
        """Remember a round's values (:func:`update_memory`)."""
        for cid, value in zip(client_ids, phi, strict=True):
            count = self.counts[cid] = self.counts.get(cid, 0) + 1
            self.phi[cid] = update_memory(self.phi.get(cid), float(value), count,
                                          self.params.memory, self.params.discount)

    def state(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint."""
        return {"phi": dict(self.phi), "counts": dict(self.counts),
                "pair_links": [[a, b, n] for (a, b), n in sorted(self.pair_links.items())],
                "select_rng": self.rng.bit_generator.state}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.phi = {str(k): float(v) for k, v in state["phi"].items()}
        self.counts = {str(k): int(v) for k, v in state["counts"].items()}
        self.pair_links = {(str(a), str(b)): int(n)  # older checkpoints: none
                           for a, b, n in state.get("pair_links", [])}
        self.rng.bit_generator.state = state["select_rng"]
