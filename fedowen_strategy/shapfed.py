"""ShapFed-WA contribution scores from class-wise last-layer updates.

Tastan, Fares, Aremu, Horvath and Nandakumar (2024), "Redefining Contributions:
Shapley-Driven Federated Learning", IJCAI 2024 (ShapFed / ShapFed-WA). ShapFed is not a
coalition game over a server evaluation set: it compares, class by class, what each client did
to the final linear layer with what the federation did, and uses the similarity as the
client's weight in aggregation (ShapFed-WA).

Formula. With ``W_g`` the global final-layer weights (``num_classes x d``; a bias, when given,
is appended as an extra column) and ``W_i`` client ``i``'s after local training:

    u_i^c  = W_i[c] - W_g[c]                                    (class-c update of client i)
    U^c    = sum_i p_i u_i^c                                     (aggregate update, p = weights)
    g_i    = max(0, (1 / C) * sum_c cos(u_i^c, U^c))             (cos = 0 for a zero vector)
    gamma  = g / sum_i g_i,   or uniform 1/n when every g_i = 0

``gamma`` sums to 1. The strategy takes it as the round's phi (already on a unit scale, so
``phi-scale`` is not applied) and weights the updates by the configured aggregation
(``softmax(gamma / T)`` by default, where ShapFed-WA itself averages with ``gamma``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def last_layer_key(state: Mapping[str, Any]) -> str:
    """Name of the final linear layer's weight (its rows are the classes): the last 2-D array
    of a model's state (numpy arrays or torch tensors)."""
    keys = [k for k, v in state.items() if v.ndim == 2]
    if not keys:
        raise ValueError(f"no 2-D weight among {list(state)}: the model needs a final linear "
                         "layer (ShapFed-WA scores it, label flipping counts its classes)")
    return keys[-1]


def _with_bias(weight: np.ndarray, bias: np.ndarray | None, what: str) -> FloatArray:
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"{what} must be a (num_classes, d) matrix; got shape {w.shape}")
    if bias is None:
        return w
    b = np.asarray(bias, dtype=np.float64).reshape(-1, 1)
    if b.shape[0] != w.shape[0]:
        raise ValueError(f"{what}: bias has {b.shape[0]} entries for {w.shape[0]} classes")
    return np.hstack([w, b])


def _rowwise_cosine(a: FloatArray, b: FloatArray) -> FloatArray:
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    dots = np.sum(a * b, axis=-1)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def shapfed_scores(
    client_last_layers: Sequence[np.ndarray],
    global_last_layer: np.ndarray,
    *,
    client_biases: Sequence[np.ndarray] | None = None,
    global_bias: np.ndarray | None = None,
    weights: Sequence[float] | None = None,
) -> FloatArray:
    """ShapFed-WA scores, one per client, non-negative and summing to 1.

    Parameters
    ----------
    client_last_layers : sequence of arrays of shape (num_classes, d)
        Each client's final linear layer weights after local training.
    global_last_layer : array of shape (num_classes, d)
        The global model's final linear layer weights the clients started from.
    client_biases, global_bias : optional
        The layer's biases, appended as an extra column when both are given.
    weights : optional sequence of floats
        Weights of the aggregate update (e.g. example counts); uniform when omitted.

    Returns
    -------
    ndarray of shape (n_clients,)
    """
    n = len(client_last_layers)
    if n == 0:
        raise ValueError("shapfed_scores needs at least one client")
    if (client_biases is None) != (global_bias is None):
        raise ValueError("give both client_biases and global_bias, or neither")
    g = _with_bias(global_last_layer, global_bias, "global_last_layer")
    biases: Sequence[np.ndarray | None] = client_biases if client_biases is not None else [None] * n
    if len(biases) != n:
        raise ValueError(f"{len(biases)} client biases for {n} clients")
    clients = [_with_bias(w, b, f"client_last_layers[{i}]") for i, (w, b) in
               enumerate(zip(client_last_layers, biases, strict=True))]
    if any(c.shape != g.shape for c in clients):
        raise ValueError(f"every client layer must have the global shape {g.shape}")
    p = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, dtype=np.float64)
    if p.shape != (n,) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError(f"weights must be {n} non-negative numbers, not all 0; got {weights!r}")
    updates = np.stack(clients) - g  # (n, C, d)
    aggregate = np.tensordot(p / p.sum(), updates, axes=1)  # (C, d)
    sims = _rowwise_cosine(updates, aggregate[None]).mean(axis=1)  # (n,)
    scores = np.clip(sims, 0.0, None)
    total = scores.sum()
    return scores / total if total > 0 else np.full(n, 1.0 / n)
