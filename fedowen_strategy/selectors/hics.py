"""``hics-fl``: HiCS-FL (Chen & Vikalo, NeurIPS 2024; official code CityChan/HiCS-FL).

Heterogeneity-guided client sampling: each client's label skew is estimated from its update
of the output layer's bias, clients are clustered by that update and its entropy, and a round
draws clusters of more balanced clients first (a preference annealed away over the run), then
clients within the drawn clusters (:mod:`fedowen_strategy.selectors.hics_estimates` holds the
formulas). Server-side only: the estimate is read from the trained clients' replies (the
arrays as sent, before any guard); no server data, no extra message.

- **Estimate**: ``g_k = (b_k - b) / s_k``, the bias update divided by the client's step scale
  ``s_k`` (:func:`fedowen_task.training.step_scale`; one float the train config asks each
  trained client for, ``step-scale``: how far a constant unit gradient moves a parameter in its
  local training). ``g_k`` is then about minus the mean gradient of the bias, the same whatever
  the lr, momentum, batch size and epochs, so one ``hics-temperature`` serves every recipe (the
  paper's T is absolute: 0.0015-0.0025 with Adam at lr 1e-3, which here, with SGD at lr 0.05
  over ~60 steps, would put every client at entropy 0). A reply without it is used unscaled.
- **Warm-up**: a client never selected is selected first (uniformly among them; the paper's
  first ``ceil(N/k)`` random rounds, and a client that joins later); the rest of the round
  comes from the clusters.
- **Stale estimates**: a client keeps the estimate of the last round its update was accepted,
  without decay (the code's); one selected whose update never was has the code's zero
  update (entropy ``ln C``, angle 0 to all). Clusters are formed each round over every client
  with an estimate, restricted to the pool when drawn.
- **Switch** (``hics-switch``, off by default): the code samples by Fraboni et al.'s
  clustered sampling (ICML 2021, Algorithm 2: :mod:`~fedowen_strategy.selectors.hics_clustered`)
  instead whenever the variance of the estimated entropies is at least 0.1; with
  ``hics-switch > 0`` so do we, from that variance over the clients with an estimate, for the
  round's slots after the warm-up, weighting each client by the num-examples of its last
  accepted reply (the mean where it sent none), on our Ward tree (of the distances; the
  code's linkage clusters the distance matrix's rows as points), with the distinct clients
  our pool needs (a draw that repeats a client is redrawn without it). The round record says
  which ``branch`` ran and the ``variance``.
- **Aggregation**: left to the strategy (equal weights as published: ``aggregation =
  "uniform"``; or FedOwen's valuation weights).

Simplified: the paper's bias (the code reads the row means of the weight update instead), the
paper's Ward clustering of the distance itself (the code clusters the distance matrix's rows as
points); the code's switch to Fraboni's clustered sampling when the entropies' variance is at
least 0.1 is opt-in (``hics-switch = 0.1``; default 0, never), and its freezing of the
estimates after warm-up under mixed Dirichlet alphas is left out; within a cluster clients are
drawn uniformly (the code's; the paper: by data size).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
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
from fedowen_strategy.selectors.hics_clustered import clustered_pick, entropy_variance
from fedowen_strategy.selectors.hics_estimates import (
    annealed_gamma,
    hics_pick,
    output_bias_key,
    skew_entropy,
)
from fedowen_strategy.settings import NO_KEYS, Keys, key
from fedowen_task import declare
from fedowen_task.protocol import NUM_EXAMPLES_FIELD, STEP_SCALE_FIELD

if TYPE_CHECKING:
    from flwr.app import RecordDict


@dataclass(frozen=True)
class HicsSettings(SelectorSettings):
    """HiCS-FL's keys (defaults: the paper's, the temperature per unit step)."""

    selector: ClassVar[str] = "hics-fl"
    hics_temperature: float = declare.key(
        0.03, "HiCS-FL's softmax temperature on the bias update per unit step",
        name="hics-temperature")
    hics_lambda: float = declare.key(
        10.0, "HiCS-FL's weight of the entropy gap in the client distance", name="hics-lambda")
    hics_gamma: float = declare.key(
        4.0, "HiCS-FL's initial preference for balanced clusters (annealed to 0)",
        name="hics-gamma")
    hics_clusters: int = declare.key(
        0, "HiCS-FL's clusters (0: clients-per-round, the paper's)", name="hics-clusters")
    hics_rounds: int = declare.key(
        0, "rounds over which HiCS-FL anneals hics-gamma to 0 (0: num-server-rounds)",
        name="hics-rounds")
    hics_switch: float = declare.key(
        0.0, "entropy variance from which HiCS-FL samples by Fraboni's clusters (0: never; "
        "the code's: 0.1)", name="hics-switch")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings."""
        k = partial(key, keys)
        checks = [
            (0.0 < self.hics_temperature < float("inf"),
             f"{k('hics_temperature')}={self.hics_temperature!r} must be a finite number > 0"),
            (0.0 <= self.hics_lambda < float("inf"),
             f"{k('hics_lambda')}={self.hics_lambda!r} must be a finite number >= 0"),
            (0.0 <= self.hics_gamma < float("inf"),
             f"{k('hics_gamma')}={self.hics_gamma!r} must be a finite number >= 0"),
            (self.hics_clusters >= 0,
             f"{k('hics_clusters')}={self.hics_clusters!r} must be >= 0 (0 = "
             "clients-per-round)"),
            (self.hics_rounds >= 0,
             f"{k('hics_rounds')}={self.hics_rounds!r} must be >= 0 (0 = num-server-rounds)"),
            (0.0 <= self.hics_switch < float("inf"),
             f"{k('hics_switch')}={self.hics_switch!r} must be a finite number >= 0 (0 = "
             "never switch; 0.1 = the code's)"),
        ]
        return [message for ok, message in checks if not ok]

    def for_run(self, num_rounds: int) -> HicsSettings:
        """``hics-rounds = 0`` is the run's ``num_rounds`` (the paper anneals over the
        training)."""
        return replace(self, hics_rounds=num_rounds) if self.hics_rounds == 0 else self

    def model_problems(self, state: Mapping[str, NDArray[Any]], num_classes: int,
                       keys: Keys = NO_KEYS) -> list[str]:
        """The model must have an output layer with a bias of one entry per class."""
        name = output_bias_key(state)
        if name is None:
            return [no_output_bias(self.selector)]
        if len(state[name]) != num_classes:
            return [f"selection={self.selector!r} reads the last linear layer's bias as the "
                    f"output layer's; the model's ({name!r}) has {len(state[name])} entries, "
                    f"the dataset {num_classes} classes: make the output layer the model's "
                    "last linear layer, with a bias (torch: nn.Linear(d, num_classes, "
                    "bias=True)), or choose another selection"]
        return []


def run_gamma(settings: HicsSettings, server_round: int) -> float:
    """``hics-gamma`` annealed to round ``server_round`` over ``hics-rounds``
    (:func:`~fedowen_strategy.selectors.hics_estimates.annealed_gamma`), which must be resolved
    by then (0 stands for the run's length: the app and ``FedOwen.start`` resolve it)."""
    if settings.hics_rounds < 1:
        raise ValueError(f"hics_rounds={settings.hics_rounds!r}: 0 stands for the run's "
                         "num-server-rounds, which the app and FedOwen.start resolve; a "
                         "selector driven by hand is built from settings.for_run(num_rounds) "
                         "or with hics_rounds set")
    return annealed_gamma(settings.hics_gamma, server_round, settings.hics_rounds)


def no_output_bias(selector: str) -> str:
    """The problem of a model without an output-layer bias, for ``selection = selector``."""
    return (f"selection={selector!r} estimates each client's label skew from its update of "
            "the output layer's bias, and the model has none (no '<layer>.bias' beside a "
            "'<layer>.weight' matrix): give its output layer a bias (torch: nn.Linear(d, "
            "num_classes, bias=True)) or choose another selection")


class Hics(Selector):
    """HiCS-FL's draw from each client's last bias update; asks the trained clients for their
    step scale; records the round's clusters."""

    def __init__(self, settings: HicsSettings) -> None:
        self.settings = settings  # hics_rounds = 0 until the run resolves it (run_gamma)
        self.updates: dict[str, list[float]] = {}  # client -> its last bias update per step
        self.tried: set[str] = set()  # clients ever selected
        self.examples: dict[str, float] = {}  # client -> num-examples of its last accepted reply
        self.bias_key: str | None = None

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """The never-selected clients first (uniformly), the rest by :meth:`draw` over the
        clients with an estimate (uniformly while there is none)."""
        fresh = [i for i, c in enumerate(pool.keys) if c not in self.tried]
        picked = [int(i) for i in rng.choice(fresh, size=min(len(fresh), pool.k),
                                             replace=False)] if fresh else []
        gamma = run_gamma(self.settings, pool.server_round)
        record: dict[str, Any] = {"warmup": len(picked), "gamma": round(gamma, 6)}
        if len(picked) < pool.k:
            rows, matrix = self.known()
            index = {c: i for i, c in enumerate(pool.keys)}
            available = np.array([c in index and index[c] not in picked for c in rows], bool)
            need = pool.k - len(picked)
            if matrix is None:  # nothing estimated yet: uniformly
                drawn = rng.choice(np.flatnonzero(available), size=need, replace=False)
            else:
                drawn, info = self.draw(rows, matrix, available, need, pool.k, gamma, rng)
                record.update(info)
            picked += [index[rows[i]] for i in drawn.tolist()]
        self.tried.update(pool.keys[i] for i in picked)
        how = "warm-up" if record["warmup"] == pool.k else "hics-fl"
        return Choice(np.sort(np.asarray(picked, dtype=np.int64)), how, record)

    def draw(self, rows: list[str], matrix: NDArray[np.float64], available: NDArray[np.bool_],
             need: int, k: int, gamma: float, rng: np.random.Generator
             ) -> tuple[NDArray[np.int64], dict[str, Any]]:
        """``need`` of the ``available`` rows: by Fraboni's Algorithm 2
        (:func:`~fedowen_strategy.selectors.hics_clustered.clustered_pick`, ``need``
        distributions, the rows' last num-examples as weights, a row without one the mean)
        when ``hics-switch`` is above 0 and the variance of the estimated entropies of the
        clients with an estimate is at least it; else by :func:`hics_pick`."""
        s = self.settings
        has = np.array([c in self.updates for c in rows], dtype=bool)
        entropy = skew_entropy(matrix, s.hics_temperature)  # once: the switch and the branch
        variance = entropy_variance(entropy[has])
        if 0.0 < s.hics_switch <= variance:
            known = [self.examples[c] for c in rows if c in self.examples]
            mean = float(np.mean(known)) if known else 1.0
            weights = np.array([self.examples.get(c, mean) for c in rows], dtype=np.float64)
            drawn, info = clustered_pick(matrix, weights, available, need, s.hics_temperature,
                                         s.hics_lambda, rng, entropy)
            branch = "clustered"
        else:
            drawn, info = hics_pick(matrix, available, need, s.hics_clusters or k, gamma,
                                    s.hics_temperature, s.hics_lambda, rng, entropy)
            branch = "entropy"
        return drawn, {"branch": branch, "variance": round(variance, 6), **info}

    def known(self) -> tuple[list[str], NDArray[np.float64] | None]:
        """The clients ever selected, sorted, and their estimates as rows (zeros for one
        without; None while no client has one)."""
        rows = sorted(self.tried)
        if not self.updates:
            return rows, None
        width = len(next(iter(self.updates.values())))
        zero = [0.0] * width
        return rows, np.array([self.updates.get(c, zero) for c in rows], dtype=np.float64)

    def train_config(self) -> dict[str, ConfigValue]:
        """Each trained client reports its step scale (:func:`fedowen_task.training.step_scale`)."""
        return {STEP_SCALE_FIELD: 1}

    def observe(self, seen: Seen) -> None:
        """Each accepted client's bias update per unit step, from its reply as sent."""
        if seen.global_state is None:
            return
        if self.bias_key is None:
            self.bias_key = output_bias_key(seen.global_state)
            if self.bias_key is None:
                raise ValueError(no_output_bias(self.settings.selector))
        before = np.asarray(seen.global_state[self.bias_key], dtype=np.float64)
        for cid, content in zip(seen.clients, seen.replies, strict=True):
            bias = sent_array(content, self.bias_key)
            if bias is None:
                continue
            scale = metric_of(content, STEP_SCALE_FIELD)
            scale = scale if np.isfinite(scale) and scale > 0 else 1.0  # unscaled: absolute T
            self.updates[cid] = ((bias - before) / scale).tolist()
            self.tried.add(cid)
            examples = metric_of(content, NUM_EXAMPLES_FIELD)
            if np.isfinite(examples) and examples > 0:
                self.examples[cid] = examples

    def state(self) -> dict[str, Any]:
        """Each client's last estimate and num-examples, and the clients ever selected."""
        return {"updates": dict(self.updates), "tried": sorted(self.tried),
                "examples": dict(self.examples)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.updates = {str(c): [float(x) for x in v]
                        for c, v in state.get("updates", {}).items()}
        self.tried = {str(c) for c in state.get("tried", [])}
        self.examples = {str(c): float(n) for c, n in state.get("examples", {}).items()}


def sent_array(content: RecordDict, name: str) -> NDArray[np.float64] | None:
    """The array ``name`` of a reply as the client sent it (None when it holds none)."""
    for record in content.array_records.values():
        if name in record:
            return np.asarray(record[name].numpy(), dtype=np.float64)
    return None
