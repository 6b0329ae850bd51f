"""First-order terms of the delta game: one backward pass of the evaluation loss.

The delta game ``nu(S) = u(theta_0 + sum_{i in S} p_i delta_i)`` (``u``: minus the mean
cross-entropy on the evaluation set) is the restriction to 0/1 weights of the smooth function
``F(x) = u(theta_0 + sum_i x_i p_i delta_i)``. Its partial derivatives along the diagonal,

    c_i(t) = dF/dx_i (t, ..., t) = grad u(theta_0 + t D) . p_i delta_i,   D = sum_j p_j delta_j,

are the players' *first-order terms*: one gradient, at ``theta_0 + t D``, gives all n of them.
``t = 0`` is the Taylor term at the global model; ``t = 1/2`` the midpoint of the applied
update. They are in the utility's units, with the sign of a contribution (a client whose update
lowers the loss gets a positive term), and a zero update gets exactly 0.

Why the midpoint: when ``F`` is quadratic, the Shapley value of player i is exactly
``integral_0^1 c_i(t) dt`` (the linear part is shared out as it is, each pairwise term
``d_i' H d_j`` split in halves), and ``c_i(t)`` is then linear in t, so ``c_i(1/2)`` is the
Shapley value. Only third and higher derivatives of the loss along the updates make it differ.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fedowen_strategy.torch_utility.coalitions import score_sum

#: ``forward(theta, x) -> logits`` for flattened parameters ``theta`` of shape (P,).
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def utility_gradient(forward: Forward, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                     batch_size: int) -> tuple[torch.Tensor, float]:
    """Gradient of minus the mean cross-entropy over ``(x, y)`` at ``theta`` (shape (P,)), and
    that utility itself (float64: the forwards the backward passes need compute it anyway).

    One backward pass per batch of ``batch_size`` examples, accumulated, so memory holds one
    batch's activations at a time.
    """
    leaf = theta.detach().clone().requires_grad_(True)
    value = 0.0
    with torch.inference_mode(False), torch.enable_grad():
        for s in range(0, len(x), batch_size):
            logits = forward(leaf, x[s : s + batch_size])
            part = score_sum(logits, y[s : s + batch_size], "neg-loss")
            value += float(part.detach())
            (part / len(x)).backward()
    assert leaf.grad is not None
    return leaf.grad.detach(), value / len(x)


def first_order_terms(forward: Forward, theta: torch.Tensor, deltas: torch.Tensor,
                      shares: np.ndarray, x: torch.Tensor, y: torch.Tensor,
                      batch_size: int) -> tuple[np.ndarray, float]:
    """``grad u(theta) . p_i delta_i`` for every player, as float64 ``(n,)``, and ``u(theta)``.

    ``theta = theta_0 + t D`` gives ``c_i(t)`` (see the module docstring); at ``t = 0`` and
    ``t = 1`` it is the empty and the grand coalition's model, so ``u(theta)`` is their value.

    Parameters
    ----------
    forward : callable
        ``forward(theta, x) -> logits`` for flattened parameters of shape (P,).
    theta : torch.Tensor
        Where the gradient is taken, flattened, shape (P,).
    deltas : torch.Tensor
        The updates ``delta_i = W_i - theta_0``, shape (n, P).
    shares : np.ndarray
        The delta game's shares ``p`` (n,).
    """
    p = torch.as_tensor(np.asarray(shares, dtype=np.float64), device=deltas.device)
    grad, value = utility_gradient(forward, theta, x, y, batch_size)
    grad = grad.double()
    # row by row in float64: no (n, P) copy, and a zero update's row gives exactly 0
    dots = torch.stack([deltas[i].double() @ grad for i in range(len(deltas))])
    return (p * dots).cpu().numpy(), value
