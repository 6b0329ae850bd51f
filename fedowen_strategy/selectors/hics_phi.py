"""``hics-phi``: FedOwen's phi exploited within HiCS-FL's label-skew clusters (a candidate,
issue 62 deliver 3).

Every FedOwen selector tried so far is below random selection on FEMNIST's writers
(docs/selection.md): Algorithm 2 concentrates the rounds on the clients of highest phi, which
narrows the population the model learns from. This candidate keeps phi's exploitation but
spreads it: each round's ``k`` slots are first allocated to clusters of clients with alike
label skew, as HiCS-FL allocates them (Chen & Vikalo, NeurIPS 2024:
:func:`~fedowen_strategy.selectors.hics_estimates.cluster_slots`, clusters of each client's
output-bias update and its entropy, drawn with ``softmax(gamma_t * mean entropy)`` annealed to
uniform over ``hics-rounds``), so a cluster of clients with rare labels keeps its share of the
slots however low its phi; then each cluster's slots go to its members by FedOwen's
Algorithm 2 (epsilon-greedy on the cumulative phi, ``bandit-memory``) instead of HiCS-FL's
uniform draw: one exploration coin per cluster, else Algorithm 2's probabilities **over the
whole pool** (:func:`~fedowen_strategy.selectors.adaptive.selection_probabilities`, its scores
shifted by the pool's minimum) restricted to the cluster. Not Algorithm 2 run on each cluster
alone: its shift by the minimum would then give each cluster's lowest member probability 0 and
sharpen the draw the smaller the cluster (on FEMNIST's writers that concentrated rounds 11-20
on 55 distinct writers, against Algorithm 2's 66 and random selection's 64). The link groups
are not used (each client is its own arm, as in DELTA); the identity cap applies.

It reads HiCS-FL's keys (``hics-temperature``, ``hics-lambda``, ``hics-gamma``,
``hics-clusters``, ``hics-rounds``; not ``hics-switch``: its slots always follow the entropy
clusters) and Algorithm 2's (``epsilon``, ``ucb-c``, ``tau``,
``bandit-memory``, ``bandit-discount``) and declares none of its own: its settings are both
types' (:class:`HicsPhiSettings`). Its memory is both selectors': HiCS-FL's estimates (a
client never selected first, stale estimates for absent clients) and Algorithm 2's remembered
phi and counts. The aggregation is the strategy's (FedOwen's softmax of phi by default).

A model without a usable output-layer bias (none, or the last linear layer's bias is not the
output layer's: :func:`~fedowen_strategy.selectors.hics_estimates.output_bias_problem`) has no
label-skew estimate: unlike ``hics-fl``, which refuses it, ``hics-phi`` then runs with all
clients as one cluster, its slots filled by Algorithm 2's probabilities over the pool (one
exploration coin a round), the warm-up of never-selected clients kept; it warns once and its
round records say ``"output_bias": false`` (and ``"clusters": 1`` where slots were drawn).
Since ``selection = "auto"`` resolves to it, a user's own model runs with ``auto`` either way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.selectors.adaptive import (
    Adaptive,
    AdaptiveSettings,
    selection_probabilities,
    selection_scores,
    unvalued_floor,
)
from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    ConfigValue,
    Pool,
    Seen,
    Selector,
)
from fedowen_strategy.selectors.hics import Hics, HicsSettings, run_gamma
from fedowen_strategy.selectors.hics_estimates import cluster_slots, output_bias_problem
from fedowen_strategy.settings import NO_KEYS, Keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HicsPhiSettings(HicsSettings, AdaptiveSettings):
    """HiCS-FL's keys (the clusters and their draw) and Algorithm 2's (the choice within a
    cluster), each read from its owner's declaration; no key of its own."""

    selector: ClassVar[str] = "hics-phi"

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """HiCS-FL's problems, then Algorithm 2's."""
        return HicsSettings.problems(self, keys) + AdaptiveSettings.problems(self, keys)

    def model_problems(self, state: Mapping[str, NDArray[Any]], num_classes: int,
                       keys: Keys = NO_KEYS) -> list[str]:
        """None: a model without a usable output bias runs as one cluster
        (:class:`HicsPhi` warns when it sees the model)."""
        return []


class HicsPhi(Selector):
    """HiCS-FL's cluster slots filled by Algorithm 2 on phi (module docstring). Asks the
    trained clients for their step scale (HiCS-FL's); its round record: ``warmup`` (clients
    never selected, taken first), ``gamma``, HiCS-FL's cluster record, ``slots`` (the slots of
    each cluster drawn) and ``explored`` (the clusters whose slots Algorithm 2 drew
    uniformly); and ``output_bias: false`` (with ``clusters: 1``) for a model without a
    usable output bias (module docstring)."""

    def __init__(self, settings: HicsPhiSettings) -> None:
        self.settings = settings
        self.estimates = Hics(settings)  # the bias estimates and the clients ever selected
        self.bandit = Adaptive(settings)  # each client's remembered phi and count
        self.output_bias: bool | None = None  # the model has a usable one (None: not seen)
        self.checked = False  # the model seen (and warned about) in this process

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """The never-selected clients first (uniformly, HiCS-FL's warm-up), the rest by
        :func:`fill_slots` over the clients with an estimate."""
        tried = self.estimates.tried
        fresh = [i for i, c in enumerate(pool.keys) if c not in tried]
        picked = [int(i) for i in rng.choice(fresh, size=min(len(fresh), pool.k),
                                             replace=False)] if fresh else []
        gamma = run_gamma(self.settings, pool.server_round)
        record: dict[str, Any] = {"warmup": len(picked), "gamma": round(gamma, 6)}
        if self.output_bias is False:
            record["output_bias"] = False
        if len(picked) < pool.k:
            more, info = self.fill_slots(pool, picked, gamma, rng)
            picked += more
            record.update(info)
        self.estimates.tried.update(pool.keys[i] for i in picked)
        how = "warm-up" if record["warmup"] == pool.k else "hics-phi"
        return Choice(np.sort(np.asarray(picked, dtype=np.int64)), how, record)

    def fill_slots(self, pool: Pool, picked: list[int], gamma: float,
                   rng: np.random.Generator) -> tuple[list[int], dict[str, Any]]:
        """``pool.k - len(picked)`` more of the pool (indices), not in ``picked``: HiCS-FL's
        slots per cluster (:func:`~fedowen_strategy.selectors.hics_estimates.cluster_slots`),
        each cluster's filled by Algorithm 2 among its available members; uniformly while no
        client has an estimate; one cluster without an output bias (:meth:`one_cluster`)."""
        if self.output_bias is False:
            return self.one_cluster(pool, picked, rng)
        rows, matrix = self.estimates.known()
        index = {c: i for i, c in enumerate(pool.keys)}
        taken = set(picked)
        available = np.array([c in index and index[c] not in taken for c in rows], bool)
        need = pool.k - len(picked)
        if matrix is None:
            drawn = rng.choice(np.flatnonzero(available), size=need, replace=False)
            return [index[rows[i]] for i in drawn.tolist()], {}
        s = self.settings
        labels, slots, info = cluster_slots(matrix, available, need,
                                            s.hics_clusters or pool.k, gamma,
                                            s.hics_temperature, s.hics_lambda, rng)
        probs = bandit_probabilities(self.bandit, pool, s)
        more: list[int] = []
        explored = 0
        for cluster in np.flatnonzero(slots).tolist():
            members = np.array([index[rows[r]] for r in
                                np.flatnonzero((labels == cluster) & available).tolist()])
            uniform = bool(rng.random() < s.epsilon)  # Algorithm 2's coin, one per cluster
            more += draw_within(probs, members, int(slots[cluster]), uniform, rng)
            explored += uniform
        info["slots"] = [int(n) for n in slots[slots > 0]]
        info["explored"] = explored
        return more, info

    def one_cluster(self, pool: Pool, picked: list[int], rng: np.random.Generator
                    ) -> tuple[list[int], dict[str, Any]]:
        """``pool.k - len(picked)`` more of the pool, not in ``picked``, with every client in
        one cluster: one exploration coin, else Algorithm 2's probabilities over the pool
        (:func:`draw_within`)."""
        taken = set(picked)
        members = np.array([i for i in range(len(pool.keys)) if i not in taken], np.int64)
        need = pool.k - len(picked)
        probs = bandit_probabilities(self.bandit, pool, self.settings)
        uniform = bool(rng.random() < self.settings.epsilon)
        more = draw_within(probs, members, need, uniform, rng)
        return more, {"clusters": 1, "slots": [need], "explored": int(uniform)}

    def train_config(self) -> dict[str, ConfigValue]:
        """HiCS-FL's: each trained client reports its step scale."""
        return self.estimates.train_config()

    def observe(self, seen: Seen) -> None:
        """HiCS-FL's estimates from the replies (none without an output bias: the model is
        checked, and warned about, the first time it is seen), Algorithm 2's memory from phi."""
        if seen.global_state is not None and not self.checked:
            self.checked = True
            problem = output_bias_problem(seen.global_state)
            self.output_bias = not problem
            if problem:
                log.warning(one_cluster_warning(problem))
        if self.output_bias is not False:
            self.estimates.observe(seen)
        else:  # no estimate to read: the clients are tried all the same
            self.estimates.tried.update(seen.clients)
        self.bandit.observe(seen)

    def state(self) -> dict[str, Any]:
        """Both memories (and ``output_bias: false`` for a model without one)."""
        state = {"estimates": self.estimates.state(), "bandit": self.bandit.state()}
        return state if self.output_bias is not False else {**state, "output_bias": False}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.estimates.load(state.get("estimates", {}))
        self.bandit.load(state.get("bandit", {}))
        self.output_bias = False if state.get("output_bias") is False else None


def one_cluster_warning(problem: str) -> str:
    """The warning for a model without a usable output bias (``problem``: what it has
    instead, :func:`~fedowen_strategy.selectors.hics_estimates.output_bias_problem`)."""
    return (f"selection='hics-phi' clusters clients by their update of the model's output-layer "
            f"bias, and {problem}: all clients form one cluster, whose slots Algorithm 2 fills "
            "on phi (never-selected clients still first). For HiCS-FL's label-skew clusters "
            "give the output layer a bias of one entry per class as the model's last layer "
            "(torch: nn.Linear(d, num_classes, bias=True))")


def bandit_probabilities(bandit: Adaptive, pool: Pool, settings: AdaptiveSettings
                         ) -> NDArray[np.float64]:
    """Algorithm 2's exploitation probabilities over the whole pool (its scores on the
    remembered phi and counts, shifted by the pool's minimum:
    :func:`~fedowen_strategy.selectors.adaptive.selection_probabilities`)."""
    phi = np.array([bandit.phi.get(c, 0.0) for c in pool.keys])
    counts = np.array([bandit.counts.get(c, 0) for c in pool.keys])
    scores = selection_scores(phi, counts, pool.server_round, settings)
    floor = unvalued_floor(scores, counts, pool.server_round, settings)
    return selection_probabilities(scores, floor)


def draw_within(probs: NDArray[np.float64], members: NDArray[np.int64], slots: int,
                uniform: bool, rng: np.random.Generator) -> list[int]:
    """``slots`` of a cluster's ``members`` (indices into the pool) without replacement:
    uniformly (``uniform``: Algorithm 2 explores), else with the pool's ``probs`` restricted to
    them (too few with a positive one: those, and the rest uniformly, as Algorithm 2 tops
    up)."""
    if uniform:
        return rng.choice(members, size=slots, replace=False).tolist()
    p = probs[members]
    positive = members[p > 0]
    if positive.size >= slots:
        return rng.choice(members, size=slots, replace=False, p=p / p.sum()).tolist()
    rest = np.setdiff1d(members, positive)
    return [*positive.tolist(), *rng.choice(rest, size=slots - positive.size,
                                            replace=False).tolist()]
