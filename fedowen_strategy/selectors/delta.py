"""``delta``: DELTA (Wang, Xu, Wang, Ye; NeurIPS 2023, arXiv 2205.13925), the paper's form.

Unbiased client sampling with the variance-optimal probabilities of the paper,

    p_i = sqrt(a1 zeta_i^2 + a2 sigma_i^2) / sum_j sqrt(a1 zeta_j^2 + a2 sigma_j^2),

``zeta_i = ||g_i - g_bar||`` a client's gradient diversity and ``sigma_i^2`` the variance of its
stochastic gradients; ``k`` clients drawn **with replacement** from them (a client drawn twice
trains once and counts twice) and the round's updates importance-weighted,
``global + sum_draws lambda_i delta_i / (k q_i)``: an unbiased estimate of the average update
over the whole pool (:mod:`~fedowen_strategy.selectors.delta_estimates` holds the formulas).

The estimates, as the paper's practical DELTA makes them:

- ``g_i`` is the mean gradient of client i's local steps, read off its update on the server:
  ``g_i = -delta_i / h_i``, ``h_i`` (:func:`fedowen_task.training.step_scale`) reported by
  the client (``step-scale``; missing: the round's median, else 1); ``g_bar`` the
  participants' mean;
- ``sigma_i^2`` is reported by the client when the train config asks (``grad-variance``: the
  mean squared norm of its per-step gradients minus the squared norm of their mean, from the
  gradients training computes anyway; missing: 0);
- only the participants' probabilities are updated, rescaled so that they keep the mass they
  had: ``P_i <- s_i / sum_S s * sum_S P_old`` (the reference code's rule); the others keep
  theirs, stale. A client never seen has mass 1, the mean mass (the rescale keeps the total,
  so the masses always average 1). The draw mixes in a uniform share (``delta-floor``):
  ``q = (1 - eps) P / sum P + eps / N`` over the pool, so no weight ``1 / q`` explodes.

Equal weights (``aggregation = "uniform"``) is the paper's objective, ``lambda_i = 1 / N``; any
other base weight ``w_i`` of the round's ``m`` accepted updates (FedOwen's softmax(phi), or
num-examples) enters as the tilt ``lambda_i = w_i m / N`` relative to an equal share, so that
uniform ``q`` gives the base aggregation exactly. ``delta-estimator = "normalised"`` divides
the weights by their sum (a ratio estimator: lower variance, biased ``O(1/k)``). Simplified
from the paper: ``a1 = 1`` and ``a2 = delta-sigma-weight`` (the paper's constants depend on
the step sizes and local steps).

The public code (L3030/DELTA_FL, :mod:`~fedowen_strategy.selectors.delta_code`) differs, and
two of its differences are opt-in here: ``delta-score = "code"`` scores a participant
``n_i ((1 - beta) ||g_i|| + beta ||g_i - g_bar||)`` (beta 0.5, ``n_i`` its num-examples; no
variance term, so the clients are asked for their step scale only), and ``delta-draw =
"without"`` draws ``k`` distinct clients without replacement and weights them
``b_i / (N q_i)`` as the code does (``b_i`` the base weight: the code's data share), which is
not unbiased; both draw from ``q``, so ``delta-floor = 0`` draws from the code's ``P``. Not
here: the code's server momentum (0.2, in its aggregation: the new model is ``global + v``,
``v <- 0.2 v + step``), which no selector's weights can express; its data size in batches
(we use num-examples).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

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
from fedowen_strategy.selectors.delta_code import (
    code_scores,
    code_weights,
    draw_without_replacement,
)
from fedowen_strategy.selectors.delta_estimates import (
    delta_scores,
    draw_probabilities,
    draw_with_replacement,
    fill_missing_with_median,
    gradient_spread,
    importance_weights,
    rescale_masses,
)
from fedowen_strategy.settings import NO_KEYS, Keys, key, one_of
from fedowen_task import declare
from fedowen_task.protocol import GRAD_VARIANCE_FIELD, NUM_EXAMPLES_FIELD, STEP_SCALE_FIELD

#: How the importance weights aggregate: a step from the global model (unbiased) or divided
#: by their sum (an average: the ratio estimator).
DELTA_ESTIMATORS = ("unbiased", "normalised")
#: The probabilities' score: the paper's sqrt(zeta^2 + a2 sigma^2) or the public code's mix.
DELTA_SCORES = ("paper", "code")
#: The draw: k i.i.d. draws (the paper's, unbiased) or k distinct clients (the public code's).
DELTA_DRAWS = ("with-replacement", "without")


@dataclass(frozen=True)
class DeltaSettings(SelectorSettings):
    """DELTA's keys: the estimator, the uniform share of the draw, the weight of the local
    variance against the gradient diversity (``a2 / a1``), and the public code's score and
    draw (opt-in)."""

    selector: ClassVar[str] = "delta"
    delta_estimator: str = declare.key(
        "unbiased", "DELTA's aggregation: unbiased (a step, weights need not sum to 1) | "
        "normalised", name="delta-estimator")
    delta_floor: float = declare.key(
        0.05, "DELTA's uniform share of the draw", name="delta-floor")
    delta_sigma_weight: float = declare.key(
        1.0, "DELTA's weight of the local variance (a2 / a1)", name="delta-sigma-weight")
    delta_score: str = declare.key(
        "paper", "DELTA's score: paper (sqrt(zeta^2 + a2 sigma^2)) | code (the public code's "
        "n_i (||g_i|| + zeta_i) / 2)", name="delta-score")
    delta_draw: str = declare.key(
        "with-replacement", "DELTA's draw: with-replacement (unbiased) | without (the public "
        "code's k distinct clients, weights b_i / (N q_i): biased)", name="delta-draw")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings."""
        found = one_of(key(keys, "delta_estimator"), self.delta_estimator, DELTA_ESTIMATORS)
        found += one_of(key(keys, "delta_score"), self.delta_score, DELTA_SCORES)
        found += one_of(key(keys, "delta_draw"), self.delta_draw, DELTA_DRAWS)
        if not 0.0 <= self.delta_floor <= 1.0:
            found.append(f"{key(keys, 'delta_floor')}={self.delta_floor!r} must lie in [0, 1] "
                         "(1: uniform draws)")
        if not (self.delta_sigma_weight >= 0 and math.isfinite(self.delta_sigma_weight)):
            found.append(f"{key(keys, 'delta_sigma_weight')}={self.delta_sigma_weight!r} must "
                         "be a finite number >= 0")
        return found


class Delta(Selector):
    """DELTA's draw from each client's probability mass, its importance weights, and the
    masses' update from the round's updates and reported variances (module docstring)."""

    def __init__(self, settings: DeltaSettings) -> None:
        self.settings = settings
        self.mass: dict[str, float] = {}  # client -> probability mass (unseen: 1)
        self.draw: dict[str, Any] = {}  # this round's: counts and q per drawn id, k, n
        self.last: dict[str, dict[str, float]] = {}  # the last round's zeta and sigma per id

    def choose(self, pool: Pool, rng: np.random.Generator, ask: AskClients) -> Choice:
        """``k`` draws with replacement from :func:`draw_probabilities` (the distinct clients
        drawn train: k or fewer), or ``k`` distinct ones without (``delta-draw``)."""
        masses = np.array([self.mass.get(c, 1.0) for c in pool.keys])
        q = draw_probabilities(masses, self.settings.delta_floor)
        if self.settings.delta_draw == "without":
            picked = draw_without_replacement(q, pool.k, rng)
            counts = np.ones(picked.size, dtype=np.int64)
        else:
            picked, counts = draw_with_replacement(q, pool.k, rng)
        ids = [pool.keys[i] for i in picked.tolist()]
        self.draw = {"counts": dict(zip(ids, counts.tolist(), strict=True)),
                     "q": dict(zip(ids, q[picked].tolist(), strict=True)),
                     "k": pool.k, "n": len(pool.keys)}
        return Choice(picked, "delta", {
            "draws": self.draw["counts"], "q": self.draw["q"],
            "unseen": int(sum(c not in self.mass for c in pool.keys)),
            "estimates": self.last})

    def train_config(self) -> dict[str, ConfigValue]:
        """Each trained client reports its gradient variance and step scale (the code's
        score: its step scale only)."""
        if self.settings.delta_score == "code":
            return {STEP_SCALE_FIELD: 1}
        return {GRAD_VARIANCE_FIELD: 1}

    def weigh(self, clients: Sequence[str], weights: NDArray[np.float64]
              ) -> NDArray[np.float64]:
        """:func:`importance_weights` of this round's draw, the base ``weights`` as the
        tilt ``lambda_i = w_i m / N`` (drawn without replacement: the code's
        :func:`~fedowen_strategy.selectors.delta_code.code_weights`)."""
        missing = [c for c in clients if c not in self.draw.get("counts", {})]
        if missing:
            raise ValueError(f"DELTA weighs only the clients it drew this round; {missing} "
                             "were not drawn")
        base = np.asarray(weights, dtype=np.float64)
        q = np.array([self.draw["q"][c] for c in clients])
        if self.settings.delta_draw == "without":
            out = code_weights(base, q, self.draw["n"])
        else:
            lam = base * len(clients) / self.draw["n"]
            counts = np.array([self.draw["counts"][c] for c in clients], dtype=np.float64)
            out = importance_weights(lam, counts, q, self.draw["k"])
        if not self.step_weights():
            out = out / out.sum() if out.sum() > 0 else np.full(out.size, 1.0 / out.size)
        return out

    def step_weights(self) -> bool:
        """The unbiased estimator is a step from the global model."""
        return self.settings.delta_estimator == "unbiased"

    def observe(self, seen: Seen) -> None:
        """The participants' new masses (:func:`rescale_masses` of :func:`delta_scores`, or
        of the code's :func:`~fedowen_strategy.selectors.delta_code.code_scores`)."""
        if seen.clients and seen.global_state is not None:
            scales = fill_missing_with_median([metric_of(r, STEP_SCALE_FIELD)
                                               for r in seen.replies])
            norms, zeta = gradient_spread(seen.states, seen.global_state, scales)
            if self.settings.delta_score == "code":
                examples = fill_missing_with_median([metric_of(r, NUM_EXAMPLES_FIELD)
                                                     for r in seen.replies])
                scores = code_scores(norms, zeta, examples)
                estimates = {"zeta": zeta, "norm": norms}
            else:
                variances = [metric_of(r, GRAD_VARIANCE_FIELD) for r in seen.replies]
                sigma_sq = np.array([v if math.isfinite(v) and v >= 0 else 0.0
                                     for v in variances])
                scores = delta_scores(zeta, sigma_sq, self.settings.delta_sigma_weight)
                estimates = {"zeta": zeta, "sigma": np.sqrt(sigma_sq)}
            old = np.array([self.mass.get(c, 1.0) for c in seen.clients])
            new = rescale_masses(old, scores)
            self.mass.update(zip(seen.clients, new.tolist(), strict=True))
            self.last = {c: {name: float(v[i]) for name, v in estimates.items()}
                         for i, c in enumerate(seen.clients)}

    def state(self) -> dict[str, Any]:
        """The masses, this round's draw and the last estimates."""
        return {"mass": dict(self.mass), "draw": dict(self.draw), "last": dict(self.last)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.mass = {str(c): float(m) for c, m in state.get("mass", {}).items()}
        draw = state.get("draw", {})
        self.draw = {} if not draw else {
            "counts": {str(c): int(n) for c, n in draw["counts"].items()},
            "q": {str(c): float(v) for c, v in draw["q"].items()},
            "k": int(draw["k"]), "n": int(draw["n"])}
        self.last = {str(c): {n: float(v) for n, v in e.items()}
                     for c, e in state.get("last", {}).items()}
