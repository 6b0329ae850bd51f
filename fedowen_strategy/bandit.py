"""The selection's state over a run, for every selector (``selection`` in the run config).

:class:`Bandit` remembers what each selector learns from past rounds (Algorithm 2's phi memory
and counts; the posterior selector's reward statistics; Oort's utilities and last rounds; the
identity cap's selection counts; lasting links) and draws a round's clients with the pure
functions of :mod:`~fedowen_strategy.selection` and :mod:`~fedowen_strategy.selectors`. The
strategy owns one and checkpoints :meth:`Bandit.state`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.links import Pair, count_links, lasting_groups
from fedowen_strategy.selection import (
    SelectionParams,
    resolve_cap,
    select_clients,
    select_uniform,
    update_memory,
)
from fedowen_strategy.selectors import (
    cap_eligible,
    heterogeneity_p,
    keep_highest,
    oort_exploration,
    oort_select,
    posterior,
    resolved_harmful,
    round_ranks,
    thompson_top,
)

#: ``candidate indices -> their local losses`` (Power-of-Choice's query to the candidates).
AskLosses = Callable[[NDArray[np.int64]], Sequence[float] | NDArray[np.float64]]


class Choice(NamedTuple):
    """A round's pick: indices into the keys, how it was made (``explored``, ``exploited``,
    ``random``, ...) and what the round record keeps of it (Power-of-Choice's candidates)."""

    indices: NDArray[np.int64]
    how: str
    record: dict[str, Any]


@dataclass
class Bandit:
    """The selection state of a run; ``mode`` is the resolved ``selection``."""

    params: SelectionParams
    rng: np.random.Generator
    mode: str = "adaptive"
    phi: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    pair_links: dict[Pair, int] = field(default_factory=dict)
    picks: dict[str, int] = field(default_factory=dict)
    rewards: dict[str, list[float]] = field(default_factory=dict)  # [n, mean, m2]
    oort: dict[str, list[float]] = field(default_factory=dict)  # [utility, last round]

    def choose(self, keys: Sequence[str], server_round: int, k: int,
               ask_losses: AskLosses | None = None) -> Choice:
        """``k`` of ``keys`` by this run's selector, within the identity cap."""
        if not 1 <= k <= len(keys):
            raise ValueError(f"cannot select k={k} clients out of {len(keys)}; "
                             f"need 1 <= k <= {len(keys)}")
        cap = resolve_cap(self.mode, self.params.cap)
        eligible = cap_eligible(np.array([self.picks.get(c, 0) for c in keys]),
                                self.groups(keys), server_round, k, cap)
        pool = np.flatnonzero(eligible) if eligible.sum() >= k else np.arange(len(keys))
        choice = self._choose([keys[i] for i in pool.tolist()], server_round, k, ask_losses,
                              pool)
        chosen = np.sort(pool[choice.indices])
        for i in chosen.tolist():
            self.picks[keys[i]] = self.picks.get(keys[i], 0) + 1
        capped = len(keys) - int(eligible.sum())
        record = {**choice.record, "capped": capped} if cap else choice.record
        return Choice(chosen, choice.how, record)

    def _choose(self, keys: Sequence[str], server_round: int, k: int,
                ask_losses: AskLosses | None, pool: NDArray[np.int64]) -> Choice:
        if self.mode == "random":
            return Choice(select_uniform(len(keys), k, self.rng), "random", {})
        if self.mode == "posterior":
            stats = np.array([self.rewards.get(c, [0.0, 0.0, 0.0]) for c in keys]).reshape(-1, 3)
            count = stats[:, 0].astype(np.int64)
            p = heterogeneity_p(count, stats[:, 1], stats[:, 2])
            if p >= self.params.resolve_level:  # no difference resolved: uniform
                return Choice(select_uniform(len(keys), k, self.rng), "uniform",
                              {"heterogeneity_p": p})
            mean, var = posterior(count, stats[:, 1], stats[:, 2])
            return Choice(thompson_top(mean, var, np.ones(len(keys), bool), k, self.rng),
                          "posterior", {"heterogeneity_p": p})
        if self.mode == "screened":
            return self._screened(keys, k)
        if self.mode == "oort":
            book = np.array([self.oort.get(c, [0.0, 0.0]) for c in keys]).reshape(-1, 2)
            eps = oort_exploration(server_round, self.params.oort_exploration_min)
            picked = oort_select(book[:, 0], book[:, 1].astype(np.int64), server_round, k, eps,
                                 self.rng)
            return Choice(picked, "oort", {"oort_exploration": eps})
        if self.mode == "power-of-choice":
            return self._power_of_choice(len(keys), k, ask_losses, pool)
        phi = np.array([self.phi.get(key, 0.0) for key in keys])
        counts = np.array([self.counts.get(key, 0) for key in keys])
        picked, explored = select_clients(phi, counts, server_round, k, self.params, self.rng,
                                          self.arms(keys))
        return Choice(picked, "explored" if explored else "exploited", {})

    def _screened(self, keys: Sequence[str], k: int) -> Choice:
        """Uniform among the clients not resolved as harmful; the screened fill up the round
        when fewer than ``k`` are left."""
        stats = np.array([self.rewards.get(c, [0.0, 0.0, 0.0]) for c in keys]).reshape(-1, 3)
        harmful = resolved_harmful(stats[:, 0].astype(np.int64), stats[:, 1], stats[:, 2],
                                   self.params.resolve_level)
        kept = np.flatnonzero(~harmful)
        picks = self.rng.choice(kept, size=min(k, kept.size), replace=False)
        if picks.size < k:
            rest = np.flatnonzero(harmful)
            picks = np.concatenate([picks, self.rng.choice(rest, size=k - picks.size,
                                                           replace=False)])
        return Choice(np.sort(picks.astype(np.int64)), "screened",
                      {"screened": int(harmful.sum())})

    def _power_of_choice(self, n: int, k: int, ask_losses: AskLosses | None,
                         pool: NDArray[np.int64]) -> Choice:
        if ask_losses is None:
            raise ValueError("selection='power-of-choice' needs ask_losses (the strategy's "
                             "local-loss query to the candidates)")
        candidates = select_uniform(n, min(max(self.params.poc_d, k), n), self.rng)
        losses = np.asarray(ask_losses(pool[candidates]), dtype=np.float64)
        kept = candidates[keep_highest(losses, k)]
        return Choice(kept, "power-of-choice",
                      {"candidates": [int(i) for i in pool[candidates]],
                       "candidate_losses": [None if np.isnan(v) else float(v) for v in losses]})

    def groups(self, keys: Sequence[str]) -> NDArray[np.int64]:
        """Each key's identity for the cap: its lasting link group's, else its own."""
        arm_of = self.arms(keys)
        return np.arange(len(keys)) if arm_of is None else arm_of

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
        """Remember a round's values (:func:`update_memory`) and the posterior selector's
        rewards (rank within the round, or phi; the screened selector's: phi)."""
        phi = np.asarray(phi, dtype=np.float64)
        by_rank = self.params.reward == "rank" and self.mode != "screened"
        reward = round_ranks(phi) if by_rank and phi.size else phi
        for cid, value, r in zip(client_ids, phi, reward, strict=True):
            count = self.counts[cid] = self.counts.get(cid, 0) + 1
            self.phi[cid] = update_memory(self.phi.get(cid), float(value), count,
                                          self.params.memory, self.params.discount)
            n, mean, m2 = self.rewards.get(cid, [0.0, 0.0, 0.0])
            delta = float(r) - mean  # Welford's update
            n, mean = n + 1, mean + delta / (n + 1)
            self.rewards[cid] = [n, mean, m2 + delta * (float(r) - mean)]

    def observe_utility(self, client_ids: Sequence[str], utility: Sequence[float],
                        server_round: int) -> None:
        """Oort's feedback: each client's statistical utility of this round."""
        for cid, u in zip(client_ids, utility, strict=True):
            self.oort[cid] = [float(u), float(server_round)]

    def state(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint."""
        return {"phi": dict(self.phi), "counts": dict(self.counts),
                "pair_links": [[a, b, n] for (a, b), n in sorted(self.pair_links.items())],
                "picks": dict(self.picks), "rewards": dict(self.rewards),
                "oort": dict(self.oort), "select_rng": self.rng.bit_generator.state}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` (older checkpoints lack the later selectors' books)."""
        self.phi = {str(k): float(v) for k, v in state["phi"].items()}
        self.counts = {str(k): int(v) for k, v in state["counts"].items()}
        self.pair_links = {(str(a), str(b)): int(n)
                           for a, b, n in state.get("pair_links", [])}
        self.picks = {str(k): int(v) for k, v in state.get("picks", {}).items()}
        self.rewards = {str(k): [float(x) for x in v]
                        for k, v in state.get("rewards", {}).items()}
        self.oort = {str(k): [float(x) for x in v] for k, v in state.get("oort", {}).items()}
        self.rng.bit_generator.state = state["select_rng"]
