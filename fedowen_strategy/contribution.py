"""One round's valuation: contributions phi, their scale, and the aggregation weights.

The utility of a coalition S is supplied by the caller (the ServerApp builds a batched torch
utility over its evaluation set); this module only decides which estimator runs, under which
budget, and how its output becomes weights.

Scale of phi. Estimators return values in the utility's raw units (accuracy gained). With ten
clients these are a few hundredths, and ``softmax(phi)`` of such numbers is uniform to within
a few percent, so the paper's aggregation would silently be FedAvg. FedOwen therefore uses the
*normalised* scale Algorithm 1 works on, ``phi / |nu(N) - nu(empty)|``, so a round's values sum
to +-1 (the sign of the round's total gain), guarded as ``l1`` below (the default). When
``|nu(N) - nu(empty)| < 1e-9`` nothing can be normalised and the raw values (all ~0) are used,
which gives uniform softmax weights. ``phi-scale = "raw"`` keeps raw gains.

The normalised scale has one failure mode, seen in the CPU experiments at alpha 0.01: when
the clients' contributions nearly cancel (raw values of +-0.08 summing to a gain of 0.003) it
inflates them to +-24 and the softmax puts all weight on one client. ``phi-scale = "l1"``
divides by ``sum |phi|`` instead, which equals ``|gain|`` for an efficient estimator whenever
all contributions share a sign and keeps ``|phi| <= 1`` when they cancel. Measured
(docs/results/phi-scale-mnist, MNIST, 20 rounds, 3 seeds): the largest weight any client got
was 0.23 with ``l1`` against 1.00 in 4 of 6 cells with ``normalised``; final accuracy 33.1 vs
26.1 at alpha 0.01, 64.2 vs 64.7 at alpha 0.1. ``l1`` is therefore the default.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.aggregation import AGGREGATIONS, NEEDS_PHI, mix_and_cap, round_weights
from fedowen_strategy.selection import SELECTIONS
from fedowen_strategy.shapfed import shapfed_scores
from fedowen_strategy.valuation import ESTIMATORS, estimate

Utility = Callable[[NDArray[np.bool_]], NDArray[np.float64]]
#: ``(global_state, client_states, num_examples[, shares=p]) -> utility``; ``shares`` is passed
#: only for the delta game.
UtilityFactory = Callable[..., Utility]

#: Valuation methods the strategy accepts: every game estimator, ShapFed-WA, none (FedAvg) and
#: multikrum (Flower's Multi-Krum selection, then FedAvg over the kept updates; a robustness
#: baseline, not a valuation).
METHODS: tuple[str, ...] = (*ESTIMATORS, "shapfed-wa", "none", "multikrum")
#: Methods that compute no contributions phi (multikrum's "phi" is its 0/1 keep mask), so
#: neither the bandit nor softmax aggregation can use them.
NO_PHI = ("none", "multikrum")
PHI_SCALES = ("normalised", "l1", "raw")
#: The coalition game: ``average`` (a coalition's model is the num-examples average of its
#: members' models) or ``delta`` (``global + sum_{i in S} p_i delta_i``, p = the aggregation's
#: base weights; a client that changed nothing is a null player).
GAMES = ("average", "delta")
_FLAT = 1e-9


def resolve_axes(method: str, selection: str, aggregation: str) -> tuple[str, str]:
    """The (selection, aggregation) a run uses; ``auto`` picks FedOwen's choices (``adaptive``,
    ``softmax``) for a valuation method and FedAvg's (``random``, ``examples``) for the methods
    in NO_PHI.

    Raises
    ------
    ValueError
        For a value outside its choices, or a combination that needs contributions from a
        method that computes none (e.g. ``valuation = "none"`` with ``softmax``).
    """
    no_phi = method in NO_PHI
    if selection == "auto":
        selection = "random" if no_phi else "adaptive"
    if aggregation == "auto":
        aggregation = "examples" if no_phi else "softmax"
    problems = []
    if selection not in SELECTIONS:
        problems.append(f"selection={selection!r} is not one of auto, {', '.join(SELECTIONS)}")
    if aggregation not in AGGREGATIONS:
        problems.append(f"aggregation={aggregation!r} is not one of auto, "
                        f"{', '.join(AGGREGATIONS)}")
    if no_phi and selection == "adaptive":
        problems.append(f"selection='adaptive' ranks clients by phi, which valuation={method!r} "
                        "does not compute: use selection='random' (or 'auto')")
    if no_phi and aggregation in NEEDS_PHI:
        problems.append(f"aggregation={aggregation!r} weights by phi, which valuation="
                        f"{method!r} does not compute: use 'examples' or 'uniform' (or 'auto')")
    if problems:
        raise ValueError("; ".join(problems))
    return selection, aggregation


@dataclass(frozen=True)
class ValuationSettings:
    """How a round is valued and aggregated (see the module docstring for ``phi_scale``);
    ``aggregation = "auto"`` resolves as in :func:`resolve_axes`."""

    method: str = "owen"
    budget_m: int = 4
    params: Mapping[str, Any] = field(default_factory=dict)
    phi_scale: str = "l1"
    temperature: float = 1.0
    krum_malicious: int = 0
    aggregation: str = "auto"
    game: str = "average"
    uniform_mix: float = 0.0
    weight_cap: float = 1.0

    def __post_init__(self) -> None:
        mix_and_cap(np.ones(1), self.uniform_mix, self.weight_cap)  # validates both
        if self.game not in GAMES:
            raise ValueError(f"game={self.game!r} is not one of {GAMES}")
        if self.method not in METHODS:
            raise ValueError(f"valuation={self.method!r} is not one of {', '.join(METHODS)}")
        _, aggregation = resolve_axes(self.method, "random", self.aggregation)
        object.__setattr__(self, "aggregation", aggregation)
        if self.budget_m < 1:
            raise ValueError(f"budget M={self.budget_m!r} must be >= 1 (paper: 4)")
        if self.phi_scale not in PHI_SCALES:
            raise ValueError(f"phi-scale={self.phi_scale!r} is not one of {PHI_SCALES}")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r} must be > 0 (paper: 1)")


@dataclass(frozen=True)
class RoundValuation:
    """Result of valuing one round's returned updates (arrays aligned with the updates)."""

    phi: NDArray[np.float64]
    phi_raw: NDArray[np.float64]
    weights: NDArray[np.float64]
    n_evals: int
    seconds: float
    nu_empty: float = float("nan")
    nu_full: float = float("nan")


def last_layer_key(state: Mapping[str, NDArray]) -> str:
    """Name of the final linear layer's weight: the last 2-D array of the state."""
    keys = [k for k, v in state.items() if v.ndim == 2]
    if not keys:
        raise ValueError("ShapFed-WA needs a final linear layer (a 2-D weight) in the model")
    return keys[-1]


def multikrum_keep(states: Sequence[Mapping[str, NDArray]], malicious: int) -> NDArray[np.bool_]:
    """Which updates Flower's Multi-Krum keeps (n - f of n, f = ``malicious``)."""
    from flwr.app import RecordDict
    from flwr.serverapp.strategy.multikrum import select_multikrum

    from fedowen_strategy.replies import state_to_record

    n = len(states)
    if n <= 2 * malicious + 2:  # Krum's guarantee needs n > 2f + 2; with fewer keep all
        return np.ones(n, dtype=bool)
    contents = [RecordDict({"arrays": state_to_record(s)}) for s in states]
    chosen = {id(c) for c in select_multikrum(contents, malicious, n - malicious)}
    return np.array([id(c) in chosen for c in contents])


def _weights(settings: ValuationSettings, phi: NDArray[np.float64],
             num_examples: Sequence[int]) -> NDArray[np.float64]:
    """The aggregation's weights, mixed with uniform and capped as configured."""
    weights = round_weights(settings.aggregation, phi, num_examples, settings.temperature)
    return mix_and_cap(weights, settings.uniform_mix, settings.weight_cap)


def delta_shares(aggregation: str, num_examples: Sequence[int]) -> NDArray[np.float64]:
    """The delta game's shares p: the weights the server applies before contributions are
    known, i.e. FedAvg's ``n_i / n`` for ``examples`` and ``1 / n`` otherwise (softmax's weights
    at T -> infinity; its applied weights depend on phi itself, so they cannot define the game).
    """
    if aggregation == "examples":
        return round_weights("examples", np.zeros(len(num_examples)), num_examples)
    return round_weights("uniform", np.zeros(len(num_examples)), num_examples)


def scale_phi(phi_raw: NDArray[np.float64], gain: float, scale: str) -> NDArray[np.float64]:
    """Put raw contributions on the configured scale (see the module docstring).

    ``normalised``: ``phi / |gain|``; ``l1``: ``phi / sum|phi|`` (equal to ``normalised`` when
    all contributions share the gain's sign, bounded by 1 in absolute value when they cancel);
    ``raw``: unchanged. Scales below 1e-9 leave the values raw.
    """
    denom = {"normalised": abs(gain), "l1": float(np.abs(phi_raw).sum()), "raw": 1.0}[scale]
    return phi_raw / denom if denom >= _FLAT else phi_raw


def value_round(
    states: Sequence[Mapping[str, NDArray]],
    num_examples: Sequence[int],
    global_state: Mapping[str, NDArray],
    settings: ValuationSettings,
    utility_factory: UtilityFactory | None,
    seed: np.random.Generator,
) -> RoundValuation:
    """Value the ``states`` returned this round and turn the values into weights."""
    start = time.perf_counter()
    n = len(states)
    if n == 0:
        raise ValueError("value_round needs at least one returned update")
    if settings.method == "none":
        zeros = np.zeros(n)
        return RoundValuation(zeros, zeros, round_weights(settings.aggregation, zeros,
                                                          num_examples), 0,
                              time.perf_counter() - start)
    if settings.method == "multikrum":
        kept = multikrum_keep(states, settings.krum_malicious)
        base = round_weights(settings.aggregation, kept.astype(np.float64), num_examples)
        weights = np.where(kept, base, 0.0)
        return RoundValuation(kept.astype(np.float64), kept.astype(np.float64),
                              weights / weights.sum(), 0, time.perf_counter() - start)
    if settings.method == "shapfed-wa":
        key = last_layer_key(global_state)
        phi = shapfed_scores([s[key] for s in states], global_state[key])
        return RoundValuation(phi, phi, _weights(settings, phi, num_examples), 0,
                              time.perf_counter() - start)
    if utility_factory is None:
        raise ValueError(f"valuation={settings.method!r} needs a utility over coalitions")
    utility = (utility_factory(global_state, states, num_examples) if settings.game == "average"
               else utility_factory(global_state, states, num_examples,
                                    shares=delta_shares(settings.aggregation, num_examples)))
    ends = utility(np.array([np.zeros(n, bool), np.ones(n, bool)]))
    nu_empty, nu_full = float(ends[0]), float(ends[1])
    budget = 2**n if settings.method == "exact" else n * settings.budget_m
    result = estimate(settings.method, utility, n, budget=budget, seed=seed, **settings.params)
    phi_raw = np.asarray(result.values, dtype=np.float64)
    phi = scale_phi(phi_raw, nu_full - nu_empty, settings.phi_scale)
    weights = _weights(settings, phi, num_examples)
    return RoundValuation(phi, phi_raw, weights, int(result.n_evals),
                          time.perf_counter() - start, nu_empty, nu_full)
