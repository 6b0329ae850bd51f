"""DELTA as its public code does it (L3030/DELTA_FL @ bc8e3a7, ``Femnist and CIfar-10/``),
where that differs from the paper: the opt-in ``delta-score = "code"`` and
``delta-draw = "without"`` of :mod:`~fedowen_strategy.selectors.delta`.

- **Score** (``local_update.py`` ``reweight_prac``, lines 177-221): with ``c`` the sampled
  clients' unweighted mean gradient (:193) and ``L_i`` a client's data size (``len`` of its
  data loader, :92: its number of batches, ``drop_last=True``, :323),

      s_i = (1 - beta) L_i / sum_S L ||g_i|| + beta L_i / sum_S L ||g_i - c||   (:195, :210, :214)

  ``beta = args.beta``, 0.5 by default (:184, :444-447); no variance term. The participants'
  masses become ``s_i / sum_S s * sum_S P_old`` (:215-219, ``alpha = 0``): the factor
  ``1 / sum_S L`` cancels there, so :func:`code_scores` leaves it out.
- **Draw** (:151): ``torch.multinomial(P, S, False)``, ``S`` distinct clients by successive
  sampling (each next one with probability proportional to ``P`` over those not yet drawn).
- **Weights** (``comm_helpers.py`` ``IS_communicate``, :56 and :65): the new model is
  ``global + sum_S L_i delta_i / (N P_i) / sum_S L``, i.e. ``w_i = (L_i / sum_S L) / (N P_i)``
  with ``P_i`` the first draw's probability (the masses sum to 1 there). With the round's base
  weight ``b_i`` in place of the data share ``L_i / sum_S L``, :func:`code_weights` is
  ``b_i / (N q_i)``.

These weights are **not an unbiased estimator** of the average update: a client's chance of
being among ``k`` drawn without replacement is not ``k P_i`` (the weights' inverse) unless the
``P_i`` are equal, so the expected step is ``sum_i pi_i b delta_i / (N P_i)``, not
``mean_i delta_i`` (tests/test_delta_code.py: 191/84 against 196/84 on three clients; the
random denominator ``sum_S L`` biases it further). Reproduced as the code has it, not
corrected.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

#: The code's mix of the gradient's norm and its diversity (``--beta``'s default).
CODE_BETA = 0.5


def code_scores(norms: NDArray[np.float64], diversity: NDArray[np.float64],
                examples: NDArray[np.float64], beta: float = CODE_BETA) -> NDArray[np.float64]:
    """The code's score ``L_i ((1 - beta) ||g_i|| + beta ||g_i - g_bar||)`` (its ``1 / sum_S
    L``, common to the round's participants, cancels in the mass update)."""
    norms, diversity = np.asarray(norms, np.float64), np.asarray(diversity, np.float64)
    return np.asarray(examples, np.float64) * ((1.0 - beta) * norms + beta * diversity)


def draw_without_replacement(q: NDArray[np.float64], k: int, rng: np.random.Generator
                             ) -> NDArray[np.int64]:
    """``k`` distinct indices by successive sampling from ``q`` (``torch.multinomial``
    without replacement), sorted; all those with ``q > 0`` when fewer than ``k`` have it
    (the code's ``torch.multinomial`` raises there)."""
    if not 1 <= k:
        raise ValueError(f"cannot draw k={k} clients; need k >= 1")
    size = min(k, int(np.count_nonzero(np.asarray(q) > 0)))
    drawn = rng.choice(q.size, size=size, replace=False, p=q)
    return np.sort(drawn).astype(np.int64)


def code_weights(base: NDArray[np.float64], q: NDArray[np.float64], n: int
                 ) -> NDArray[np.float64]:
    """The code's importance weights ``b_i / (N q_i)``: ``b_i`` a client's base weight
    among the round's updates (the code's data share ``L_i / sum_S L``), ``q_i`` its first
    draw's probability, ``N`` the pool's size. Biased (module docstring)."""
    return np.asarray(base, np.float64) / (n * np.asarray(q, np.float64))
