"""``delta-phi``: DELTA's unbiased sampling with FedOwen's phi as the utility (a candidate,
issue 62 deliver 3).

FedOwen's selectors lose to random selection on FEMNIST's writers because exploiting phi
narrows the population the model learns from (docs/selection.md). DELTA (Wang et al., NeurIPS
2023) prefers some clients without narrowing anything: it draws ``k`` clients **with
replacement** from ``q`` and weighs each update ``c_i lambda_i / (k q_i)``, so the round's step
is, in expectation over the draws, the average over every client of the pool. This candidate
keeps that estimator (:class:`~fedowen_strategy.selectors.delta.Delta`'s draw and weights,
``delta-estimator``) and replaces DELTA's gradient-diversity probabilities by phi:

    mass_i = max(Phi_i, 0) / mean over the pool's valued clients of max(Phi_j, 0)
    q_i    = (1 - f) mass_i / sum_j mass_j + f / N        (f = delta-phi-floor)

``Phi_i`` a client's remembered phi (Algorithm 2's memory, ``bandit-memory``: the running mean
by default); a client never valued has the mean mass 1 (DELTA's convention for an unseen
client); all masses are 1 when no valued client has a positive ``Phi``. Why the positive part
of phi itself, not its rank: phi is a client's share of the round's gain in the server's
utility, so ``q ~ phi`` is importance sampling of that gain (a client helping twice as much is
drawn twice as often, and weighed half as much); where the clients' phi barely differ
(FEMNIST's writers) the draw stays near uniform, where a rank would spread it by the same
factor whatever the differences. A client whose phi is below 0 is drawn by the floor alone.
The floor ``f`` is the one knob: ``1`` is uniform selection with FedOwen's weights, ``0`` pure
phi-proportional draws; any ``f`` bounds each importance weight by ``1 / f`` times its
value under uniform draws (``q_i >= f / N``).

The weights: FedOwen's valuation (softmax of phi) enters as DELTA's tilt ``lambda_i = w_i m /
N`` (:meth:`Delta.weigh <fedowen_strategy.selectors.delta.Delta.weigh>`): the importance
correction undoes the sampler's preference, the valuation alone decides the clients' relative
weights. Asks the clients nothing beyond their update; no extra message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.selectors.adaptive import Adaptive, AdaptiveSettings
from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    Pool,
    Seen,
    Selector,
    SelectorSettings,
)
from fedowen_strategy.selectors.delta import Delta, DeltaSettings
from fedowen_strategy.settings import NO_KEYS, Keys, key
from fedowen_task import declare


@dataclass(frozen=True)
class DeltaPhiSettings(SelectorSettings):
    """delta-phi's floor (its own key), and the keys it reads of DELTA (``delta-estimator``)
    and of Algorithm 2 (``bandit-memory``, ``bandit-discount``: how phi accumulates)."""

    selector: ClassVar[str] = "delta-phi"
    delta_phi_floor: float = declare.key(
        0.5, "delta-phi's uniform share of the draw (1: uniform; 0: proportional to phi)",
        name="delta-phi-floor")
    delta_estimator: str = dataclasses.field(
        default=DeltaSettings.delta_estimator, metadata=declare.named("delta-estimator"))
    memory: str = dataclasses.field(
        default=AdaptiveSettings.memory, metadata=declare.named("bandit-memory"))
    discount: float = dataclasses.field(
        default=AdaptiveSettings.discount, metadata=declare.named("bandit-discount"))

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """The floor's rule, then DELTA's and Algorithm 2's for the keys it reads."""
        found = [] if 0.0 <= self.delta_phi_floor <= 1.0 else [
            f"{key(keys, 'delta_phi_floor')}={self.delta_phi_floor!r} must lie in [0, 1] "
            "(1: uniform draws)"]
        return (found + DeltaSettings.problems_of({"delta_estimator": self.delta_estimator},
                                                  keys)
                + AdaptiveSettings.problems_of({"memory": self.memory,
                                                "discount": self.discount}, keys))


class DeltaPhi(Selector):
    """DELTA's draw and importance weights over :func:`phi_masses`. Its round record is
    DELTA's (``draws``, ``q``, ``unseen``: the pool's never-valued clients)."""

    def __init__(self, settings: DeltaPhiSettings) -> None:
        self.settings = settings
        self.bandit = Adaptive(AdaptiveSettings(memory=settings.memory,
                                                discount=settings.discount))
        # DELTA's draw, weights and record; its masses are set from phi before each draw
        self.sampler = Delta(DeltaSettings(delta_estimator=settings.delta_estimator,
                                           delta_floor=settings.delta_phi_floor))

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """DELTA's ``k`` draws with replacement from ``q`` over :func:`phi_masses`."""
        valued = [c for c in pool.keys if c in self.bandit.counts]
        masses = phi_masses(np.array([self.bandit.phi[c] for c in valued]))
        self.sampler.mass = dict(zip(valued, masses.tolist(), strict=True))
        choice = self.sampler.choose(pool, rng, ask)
        record = {k: v for k, v in (choice.record or {}).items() if k != "estimates"}
        return Choice(choice.indices, "delta-phi", record)

    def weigh(self, clients: Sequence[str], weights: NDArray[np.float64]
              ) -> NDArray[np.float64]:
        """DELTA's importance weights with the valuation's as the tilt."""
        return self.sampler.weigh(clients, weights)

    def step_weights(self) -> bool:
        """DELTA's: the unbiased estimator is a step from the global model."""
        return self.sampler.step_weights()

    def observe(self, seen: Seen) -> None:
        """Remember each valued client's phi (Algorithm 2's memory)."""
        self.bandit.observe(seen)

    def state(self) -> dict[str, Any]:
        """The remembered phi and counts, and DELTA's round draw."""
        return {"bandit": self.bandit.state(), "draw": self.sampler.state()["draw"]}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.bandit.load(state.get("bandit", {}))
        self.sampler.load({"draw": state.get("draw", {})})


def phi_masses(phi: NDArray[np.float64]) -> NDArray[np.float64]:
    """The draw masses of clients valued so far, from their remembered ``phi``: the positive
    part over its mean (so an unvalued client's mass 1 is the mean); all 1 when none is
    positive."""
    positive = np.maximum(np.asarray(phi, dtype=np.float64), 0.0)
    mean = positive.mean() if positive.size else 0.0
    return positive / mean if mean > 0 else np.ones(positive.size)
