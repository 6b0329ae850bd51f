"""``first-order``: each player's first-order term as its value (one gradient, no sampling).

For a game that is the restriction of a smooth ``F`` to 0/1 weights (the delta game:
``F(x) = u(theta_0 + sum_i x_i p_i delta_i)``), the players' first-order terms
``c_i(t) = dF/dx_i (t, ..., t)`` come from one gradient (:mod:`fedowen_strategy.valuation._base`
for the contract, :mod:`fedowen_strategy.torch_utility.gradient` for the torch utility).
``phi_i = c_i(at)``:

* ``at = 0``: the Taylor term at the global model (the linearised game's Shapley value;
  DIG-FL-like);
* ``at = 1/2`` (default): the midpoint of the applied update, exact for any game whose ``F``
  is quadratic (every pairwise interaction split in halves, as the Shapley value splits it);
  only third and higher derivatives of ``F`` bias it.

Deterministic and biased (by the game's cubic and higher terms); exact on additive games at any
``at``; a null player (zero update) gets exactly 0; not efficient (the values sum to
``dF/dt`` along the diagonal at ``at``, not to ``nu(N) - nu(empty)``). It spends the two
evaluations every method spends (``nu(empty)``, ``nu(N)``) and one gradient.
"""

from __future__ import annotations

import numpy as np

from fedowen_strategy.valuation._base import CachedGame, FloatArray


def first_order(game: CachedGame, rng: np.random.Generator, *, at: float = 0.5) -> FloatArray:
    """``phi_i = c_i(at)``: the utility's first-order terms (see the module docstring)."""
    if not 0.0 <= at <= 1.0:
        raise ValueError(f"at={at!r} must lie in [0, 1] (0: the global model, 0.5: the "
                         "midpoint of the applied update, 1: the aggregate)")
    return game.first_order(at)
