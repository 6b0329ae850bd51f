"""FoolsGold: down-weight clients whose update histories are too similar to each other's.

[Fung, Yoon and Beschastnikh, "The Limitations of Federated Learning in Sybil Settings",
RAID 2020], https://www.usenix.org/conference/raid2020/presentation/fung; the reference
implementation is github.com/DistributedML/FoolsGold (``foolsgold.py``).

The server keeps every client's accumulated update ``H_i = sum_t d_i^t`` over the rounds it
took part in. Each round, over the participants: pairwise cosine similarities ``cs_ij`` of
the histories; ``v_i = max_j cs_ij``; *pardoning* ``cs_ij *= v_i / v_j`` whenever
``v_i < v_j`` (an honest client that happens to resemble a Sybil is not punished for the
Sybils' similarity to each other); ``a_i = 1 - max_j cs_ij`` clipped to [0, 1]; rescaled by
its maximum (the most distinct client gets 1, set to 0.99 to keep the logit finite);
``a_i = kappa (ln(a_i / (1 - a_i)) + 0.5)`` clipped to [0, 1]. Copies of one update (Sybils)
have similarity 1 and get 0; honest clients with distinct data keep weights near 1.

Applied here as aggregation weights: the new global model is ``W + sum_i a_i d_i / sum_i
a_i`` (``num-examples`` is not used: it is self-reported, and the paper weights clients
equally). When every ``a_i`` is 0 (e.g. every participant is a copy of one update) the global
model is kept and the round's record says so. The history holds all floating arrays in
float32: 4 bytes x parameters x clients ever selected (24 MB for LeNet-5 and 100 clients).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.fedavg_args import takes_fedavg_arguments
from fedowen_strategy.peers import UpdateWeighted
from fedowen_strategy.updates import State, gram_cosines, row_gram

log = logging.getLogger(__name__)

_ROUNDING = 1e-9


def foolsgold_scores(histories: NDArray[np.floating], kappa: float = 1.0
                     ) -> NDArray[np.float64]:
    """FoolsGold's weight in [0, 1] per row of ``histories`` (see the module docstring); the
    cosines in float64 (:func:`fedowen_strategy.updates.row_gram`: copies' come out within
    1e-15 of 1, which :data:`_ROUNDING` reads)."""
    if not kappa > 0:
        raise ValueError(f"kappa={kappa!r} must be > 0 (FoolsGold's confidence; 1 in the paper)")
    h = np.asarray(histories)
    n = len(h)
    cs = gram_cosines(row_gram(h.reshape(n, -1)))
    np.fill_diagonal(cs, 0.0)  # the reference code's cosine - identity
    v = cs.max(axis=1) if n > 1 else np.zeros(n)
    pardon = v[:, None] < v[None, :]
    ratio = np.divide(v[:, None], v[None, :], out=np.ones((n, n)), where=pardon)
    cs = np.where(pardon, cs * ratio, cs)
    a = np.clip(1.0 - (cs.max(axis=1) if n > 1 else np.zeros(n)), 0.0, 1.0)
    a[a < _ROUNDING] = 0.0  # copies' cosine comes out as 1 - 2e-16, not 1
    if a.max() <= 0.0:
        return np.zeros(n)
    a = a / a.max()
    a[a >= 1.0] = 0.99
    with np.errstate(divide="ignore"):
        logit = kappa * (np.log(a / (1.0 - a)) + 0.5)
    return np.clip(np.nan_to_num(logit, nan=0.0, neginf=0.0), 0.0, 1.0)


class FoolsGold(UpdateWeighted):
    """FoolsGold as a thin subclass of Flower's FedAvg (same sampling and arguments).

    Parameters
    ----------
    kappa : float
        The confidence of the logit (1 in the paper and its reference code).
    fraction_train, ..., evaluate_metrics_aggr_fn
        As in Flower's ``FedAvg``; ``weighted_by_key`` is only checked, it does not weight.
    """

    name = "foolsgold"

    @takes_fedavg_arguments
    def __init__(self, kappa: float = 1.0, **fedavg: Any) -> None:
        if not kappa > 0:
            raise ValueError(f"kappa={kappa!r} must be > 0 (FoolsGold's confidence)")
        super().__init__(**fedavg)
        self.kappa = kappa
        self.history: dict[str, NDArray[np.float32]] = {}

    def summary(self) -> None:
        log.info("\t├──> FoolsGold: kappa %.3g, %d client histories", self.kappa,
                 len(self.history))
        super().summary()

    def combine(self, server_round: int, reference: State, client_ids: list[str],
                deltas: NDArray[np.floating], keys: list[str]
                ) -> tuple[NDArray[np.floating] | None, NDArray[np.float64], dict[str, Any]]:
        for cid, d in zip(client_ids, deltas, strict=True):
            past = self.history.get(cid)
            self.history[cid] = (d if past is None else past + d).astype(np.float32)
        scores = foolsgold_scores(np.stack([self.history[c] for c in client_ids]), self.kappa)
        extra: dict[str, Any] = {"foolsgold": dict(zip(client_ids, scores.tolist(),
                                                       strict=True))}
        total = float(scores.sum())
        if total == 0.0:
            extra["kept_global"] = "every FoolsGold weight is 0 (all histories alike)"
            return None, scores, extra
        weights = scores / total
        return weights.astype(deltas.dtype) @ deltas, weights, extra
