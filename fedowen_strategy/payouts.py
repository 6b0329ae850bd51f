"""The payout ledger: what each client earned over a run, and how sure that figure is.

Per client, from the rounds in which it was valued (``phi`` recorded in ``rounds.jsonl``):
rounds selected and valued, total and mean phi, a 95% confidence interval, the phi it is paid
on, rank by that (1 = highest), a share of a payout pool (the non-negative part of the paid
phi, normalised over clients) and a flag where the interval lies wholly below zero.

Forfeit: a client id that returned a copy of another client's update in some round (the
round's ``duplicates`` record, :class:`fedowen_strategy.defences.guard_settings.Guards`'
``duplicate_tolerance``) is one actor under several identities. Within a round the game
shares a copy's contribution with its twins, but a copy selected alone looks like an honest
update, so over a run a Sybil identity earns like an honest client. Its gains are forfeited:
it is paid on ``min(total phi, 0)`` (losses stand), so it ranks at or below every client
with a positive total and takes no share of the pool.

The interval is a Student-t interval of the client's *per-round* phi across the rounds it
was valued in: ``mean +- t(0.975, m - 1) s / sqrt(m)`` for ``m`` rounds, and the same
interval times ``m`` for the total. It treats a client's rounds as repeated draws of its
contribution, so it covers both the spread across rounds (other co-selected clients, the
model's stage) and each round's estimator noise, which is part of every recorded phi; the
estimators' own per-round standard errors are not recorded and not added (that would count
the estimator noise twice). A client valued once has no spread of its own: it gets the
pooled within-client standard deviation of the run's clients valued at least twice (with
their pooled degrees of freedom), so its interval is finite and as wide as one draw's; if
no client was valued twice the interval is NaN and the client is never flagged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedowen_strategy.nodes import client_order

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Payout:
    """One client's line of the ledger (``ci`` = the interval of the mean phi)."""

    client_id: str
    rounds_selected: int
    rounds_valued: int
    total_phi: float
    total_ci_low: float
    total_ci_high: float
    mean_phi: float
    ci_low: float
    ci_high: float
    ci_from: str  # "own" spread, "pooled" spread (valued once), or "none"
    paid_phi: float
    rank: int
    payout_share: float
    ci_below_zero: bool
    forfeited: bool
    adversary: bool | None


def client_values(rounds: Iterable[Mapping[str, Any]], field: str = "phi"
                  ) -> tuple[dict[str, list[float]], dict[str, int]]:
    """(client -> its finite per-round ``field`` values, client -> rounds selected)."""
    values: dict[str, list[float]] = {}
    selected: dict[str, int] = {}
    for rec in rounds:
        for cid in rec.get("selected") or []:
            selected[str(cid)] = selected.get(str(cid), 0) + 1
        for cid, v in (rec.get(field) or {}).items():
            values.setdefault(str(cid), [])
            if v is not None and math.isfinite(float(v)):
                values[str(cid)].append(float(v))
    return values, selected


def _t(df: float, confidence: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, df))


def pooled_sd(values: Mapping[str, Sequence[float]]) -> tuple[float, int]:
    """(pooled within-client standard deviation, its degrees of freedom) over the clients
    with at least two values; (NaN, 0) when there are none."""
    ss = sum(float(np.var(v, ddof=1)) * (len(v) - 1) for v in values.values() if len(v) > 1)
    df = sum(len(v) - 1 for v in values.values() if len(v) > 1)
    return (math.sqrt(ss / df), df) if df else (math.nan, 0)


def linked_clients(rounds: Iterable[Mapping[str, Any]]) -> set[str]:
    """Client ids recorded in any round's ``duplicates`` groups (copies of another's update)."""
    return {str(c) for rec in rounds for group in rec.get("duplicates") or [] for c in group}


def payouts(values: Mapping[str, Sequence[float]], selected: Mapping[str, int] | None = None,
            adversaries: Iterable[str] | None = None, confidence: float = CONFIDENCE,
            forfeited: Iterable[str] = ()) -> list[Payout]:
    """The ledger, one :class:`Payout` per client with at least one value, by rank; the
    ``forfeited`` clients are paid on ``min(total, 0)`` (see the module docstring)."""
    valued = {c: list(v) for c, v in values.items() if v}
    sd_pool, df_pool = pooled_sd(valued)
    totals = {c: float(np.sum(v)) for c, v in valued.items()}
    lost = {str(c) for c in forfeited}
    paid = {c: min(t, 0.0) if c in lost else t for c, t in totals.items()}
    pool = sum(max(t, 0.0) for t in paid.values())
    adv = None if adversaries is None else {str(a) for a in adversaries}
    out = []
    for cid, vals in valued.items():
        m, mean = len(vals), float(np.mean(vals))
        if m > 1:
            sd = float(np.std(vals, ddof=1))
            half, source = _t(m - 1, confidence) * sd / math.sqrt(m), "own"
        elif df_pool:
            half, source = _t(df_pool, confidence) * sd_pool, "pooled"
        else:
            half, source = math.nan, "none"
        rank = 1 + sum(t > paid[cid] for t in paid.values())
        out.append(Payout(cid, (selected or {}).get(cid, m), m, totals[cid],
                          m * (mean - half), m * (mean + half), mean, mean - half, mean + half,
                          source, paid[cid], rank,
                          max(paid[cid], 0.0) / pool if pool > 0 else 0.0,
                          bool(mean + half < 0), cid in lost,
                          None if adv is None else cid in adv))
    return sorted(out, key=lambda p: (p.rank, client_order(p.client_id)))
