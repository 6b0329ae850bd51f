"""FLTrust: Byzantine-robust federated learning via trust bootstrapping.

[Cao, Fang, Liu and Gong, NDSS 2021], https://arxiv.org/abs/2012.13995

Every round the server trains the global model on its own small, clean *root set* with the
clients' local-training settings; its update ``g0`` bootstraps trust. A client update
``g_i`` gets the trust score ``TS_i = ReLU(cos(g_i, g0))``, is rescaled to the server
update's norm, and the new global model is ``W + sum_i TS_i (||g0|| / ||g_i||) g_i /
sum_i TS_i``, times the server learning rate ``alpha`` of the paper's Algorithm 1 (its
``w <- w - alpha * g``; default 1). An update pointing away from the server's (cosine <= 0)
gets weight 0 and a boosted update can be no larger than the server's, however it was scaled.
When every score is 0 (or ``g0`` is 0) no client is trusted and the global model is kept; the
round's record says so (``kept_global``). A client that returned the global model unchanged
(``||g_i|| = 0``) has no direction and gets trust 0.

Every update takes the server update's norm, so ``||g0||`` sets the global step size: in the
paper server and clients run the same number of local iterations, so the two are alike; here
clients train ``local-epochs`` over their own data and the server over its root set, and on
long-tailed MNIST (600 root images, 60 steps a round) ``||g0||`` came out 2-7x the norm of the
clients' mean update, which overshoots (docs/arena.md). ``alpha`` brings the step back; the
arena tunes it on clean runs. A server update or aggregate that is not finite (the root-set
training diverged) keeps the global model and says so in the round's record.

The server update comes from a callable (``server_update(global_state, round) -> state``), so
this module needs no torch; the ServerApp trains a torch model on the root set
(:mod:`server_app.peers`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.fedavg_args import takes_fedavg_arguments
from fedowen_strategy.peers import UpdateWeighted
from fedowen_strategy.updates import State, cosines_to, flat_delta, vector_norm

log = logging.getLogger(__name__)

#: ``(global state, server round) -> the global model trained on the root set``.
ServerUpdate = Callable[[dict[str, NDArray], int], Mapping[str, NDArray]]


def trust_scores(deltas: NDArray[np.floating], server_delta: NDArray[np.floating]
                 ) -> NDArray[np.float64]:
    """``ReLU(cos(g_i, g0))`` per row of ``deltas``; 0 where either vector is 0."""
    return np.maximum(cosines_to(deltas, server_delta), 0.0)


def fltrust_aggregate(deltas: NDArray[np.floating], server_delta: NDArray[np.floating]
                      ) -> tuple[NDArray[np.floating] | None, NDArray[np.float64],
                                 NDArray[np.float64]]:
    """(aggregate update or None when no client is trusted, weights ``TS_i / sum TS``,
    trust scores ``TS_i``) of one round; every update is rescaled to ``||g0||``."""
    trust = trust_scores(deltas, server_delta)
    total = float(trust.sum())
    if total == 0.0:
        return None, np.zeros(len(deltas)), trust
    weights = trust / total
    norms = np.array([vector_norm(row) for row in deltas])
    scale = np.divide(vector_norm(server_delta), norms, out=np.zeros(len(deltas)),
                      where=norms > 0)
    # one matrix-vector product in the updates' dtype (no float64 copy of them)
    return (weights * scale).astype(deltas.dtype) @ deltas, weights, trust


class FLTrust(UpdateWeighted):
    """FLTrust as a thin subclass of Flower's FedAvg (same sampling and arguments).

    Parameters
    ----------
    server_update : callable
        ``(global_state, server_round) -> state``: the global model trained on the root set
        (one local-training step of the server, e.g. one epoch).
    server_lr : float
        The paper's global learning rate ``alpha``: the aggregate is scaled by it (> 0).
    fraction_train, ..., evaluate_metrics_aggr_fn
        As in Flower's ``FedAvg``; ``weighted_by_key`` is only checked (each reply needs a
        positive integer count), it does not weight: trust does.
    """

    name = "fltrust"

    @takes_fedavg_arguments
    def __init__(self, server_update: ServerUpdate, *, server_lr: float = 1.0,
                 **fedavg: Any) -> None:
        super().__init__(**fedavg)
        if not (math.isfinite(server_lr) and server_lr > 0):
            raise ValueError(f"server_lr={server_lr} must be a finite number > 0 (FLTrust's "
                             "global learning rate; 1 applies the aggregate as it is)")
        self.server_update = server_update
        self.server_lr = float(server_lr)

    def summary(self) -> None:
        log.info("\t├──> FLTrust: trust = ReLU(cos(client update, server root-set update)), "
                 "updates rescaled to the server update's norm, server lr %g", self.server_lr)
        super().summary()

    def combine(self, server_round: int, reference: State, client_ids: list[str],
                deltas: NDArray[np.floating], keys: list[str]
                ) -> tuple[NDArray[np.floating] | None, NDArray[np.float64], dict[str, Any]]:
        server_state = self.server_update(dict(reference), server_round)
        g0 = flat_delta(server_state, reference, keys)
        if not np.isfinite(g0).all():
            return None, np.zeros(len(client_ids)), {
                "server_update_norm": None,
                "kept_global": "the server's update on its root set is not finite (its "
                               "training diverged)"}
        delta, weights, trust = fltrust_aggregate(deltas, g0)
        extra: dict[str, Any] = {"trust": dict(zip(client_ids, trust.tolist(), strict=True)),
                                 "server_update_norm": vector_norm(g0)}
        if delta is None:
            extra["kept_global"] = ("every trust score is 0 (no update points the server "
                                    "update's way)")
            return None, weights, extra
        return self.server_lr * delta, weights, extra
