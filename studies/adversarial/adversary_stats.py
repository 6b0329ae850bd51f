"""What adversaries get in a cell's records: their rank of phi, their share of participants and
of aggregation weight per round, and what the payout ledger pays them.

Which partitions are adversarial is a pure function of (num-supernodes, adversary-fraction,
seed) (:meth:`fedowen_task.adversary.keys.AdversaryConfig.ids`), so everything here is
computed from a cell's ``rounds.jsonl``: per round, ``returned`` (partition ids that trained),
``phi`` and ``weights``. :mod:`studies.adversarial.report` turns these into the report's tables
and plots.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedowen_strategy.payouts import client_values, linked_clients, payouts
from sim.results import CellResult

SERIES_KEYS = ("share", "weight_share", "adv_rank", "honest_rank", "adv_phi", "honest_phi")


def rank_percentiles(phi: dict[str, float]) -> dict[str, float]:
    """Each client's rank of phi within the round scaled to [0, 1]: 0 = highest phi, 1 =
    lowest; ties share their average rank; a lone client gets 0.5."""
    if len(phi) < 2:
        return {c: 0.5 for c in phi}
    vals = {c: (-math.inf if v is None else float(v)) for c, v in phi.items()}
    out = {}
    for c, v in vals.items():
        greater = sum(w > v for w in vals.values())
        ties = sum(w == v for w in vals.values()) - 1
        out[c] = (greater + ties / 2) / (len(vals) - 1)
    return out


def round_stats(rec: dict[str, Any], adv: frozenset[str]) -> dict[str, float]:
    """Adversary share of participants and of weight, mean rank percentile of adversaries and
    of honest clients (NaN where a group is absent) for one round record."""
    returned = [str(c) for c in rec.get("returned") or []]
    share = sum(c in adv for c in returned) / len(returned) if returned else math.nan
    weights = {str(k): float(v) for k, v in (rec.get("weights") or {}).items() if v is not None}
    total = sum(weights.values())
    wshare = sum(v for k, v in weights.items() if k in adv) / total if total else math.nan
    phi = {str(k): v for k, v in (rec.get("phi") or {}).items()}
    ranks = rank_percentiles(phi)
    adv_r = [r for c, r in ranks.items() if c in adv]
    hon_r = [r for c, r in ranks.items() if c not in adv]
    adv_p = [float(v) for c, v in phi.items() if c in adv and v is not None]
    hon_p = [float(v) for c, v in phi.items() if c not in adv and v is not None]
    return {"share": share, "weight_share": wshare,
            "adv_rank": float(np.mean(adv_r)) if adv_r else math.nan,
            "honest_rank": float(np.mean(hon_r)) if hon_r else math.nan,
            "adv_phi": float(np.mean(adv_p)) if adv_p else math.nan,
            "honest_phi": float(np.mean(hon_p)) if hon_p else math.nan}


def cell_adversaries(result: CellResult, num_partitions: int) -> frozenset[str]:
    """The cell's adversarial partition ids, as the strings the records use."""
    return result.cell.config.adversary().client_ids(num_partitions)


def cell_series(result: CellResult, num_partitions: int) -> dict[str, np.ndarray]:
    """Per-round arrays (rounds 1..R recorded so far) of :func:`round_stats`' keys."""
    adv = cell_adversaries(result, num_partitions)
    recs = [r for r in result.rounds if r.get("round", 0) > 0]
    stats = [round_stats(r, adv) for r in recs]
    return {"round": np.array([r["round"] for r in recs], dtype=float),
            **{k: np.array([s[k] for s in stats], dtype=float) for k in SERIES_KEYS}}


def ledger_stats(result: CellResult, num_partitions: int,
                 adversaries: frozenset[str] | None = None) -> dict[str, float]:
    """The cell's payout ledger summarised for adversaries vs honest clients: mean paid phi
    per client, mean rank percentile (0 = top of the ledger, 1 = bottom), the adversaries'
    share of the payout pool and how many of each were forfeited (caught returning copies).
    ``adversaries``: the ids to read as adversaries (default: the cell's own; another cell's
    reads what the same identities earn in this run)."""
    adv = cell_adversaries(result, num_partitions) if adversaries is None else adversaries
    recs = [r for r in result.rounds if r.get("round", 0) > 0]
    values, selected = client_values(recs)
    rows = payouts(values, selected, adv, forfeited=linked_clients(recs))
    if not rows:
        return {}
    n = len(rows)
    pct = {r.client_id: (r.rank - 1) / (n - 1) if n > 1 else 0.5 for r in rows}
    bad = [r for r in rows if r.client_id in adv]
    good = [r for r in rows if r.client_id not in adv]

    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else math.nan

    return {"ledger_adv_paid": mean([r.paid_phi for r in bad]),
            "ledger_honest_paid": mean([r.paid_phi for r in good]),
            "ledger_adv_rank": mean([pct[r.client_id] for r in bad]),
            "ledger_honest_rank": mean([pct[r.client_id] for r in good]),
            "ledger_adv_pool": float(sum(r.payout_share for r in bad)),
            "ledger_payout_ratio": _ratio(mean([r.payout_share for r in bad]),
                                          mean([r.payout_share for r in good])),
            "ledger_adv_clients": float(len(bad)) / n,
            "ledger_adv_forfeited": float(sum(r.forfeited for r in bad)),
            "ledger_honest_forfeited": float(sum(r.forfeited for r in good))}


def _ratio(adversary: float, honest: float) -> float:
    """An adversary's mean payout share over an honest client's (NaN when honest clients got
    nothing: no pool to compare with)."""
    return adversary / honest if honest > 0 else math.nan


def moving_average(x: np.ndarray, k: int) -> np.ndarray:
    """Centred ``k``-point mean that ignores NaNs and shrinks the window at the edges."""
    ok = np.isfinite(x)
    kernel = np.ones(max(1, min(k, len(x))))
    num = np.convolve(np.where(ok, x, 0.0), kernel, mode="same")
    den = np.convolve(ok.astype(float), kernel, mode="same")
    return np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)
