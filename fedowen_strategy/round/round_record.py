"""One round's record, ledger rows and train metrics, from what the strategy did.

Pure functions: :class:`~fedowen_strategy.strategy.FedOwen` hands the record and the ledger
rows to its ``on_round`` hook (the ServerApp writes them to ``rounds.jsonl`` and
``ledger.csv``) and returns the metrics in the round's ``MetricRecord``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import MetricRecord, RecordDict

from fedowen_strategy.replies import ParsedReplies
from fedowen_strategy.round.round_valuers import RoundValuation

log = logging.getLogger(__name__)


def round_record(selected: Sequence[str], parsed: ParsedReplies, method: str,
                 duplicates: Sequence[Sequence[str]], extra: Mapping[str, Any],
                 val: RoundValuation | None) -> dict[str, Any]:
    """The round's record: who was selected, returned, failed, rejected or clipped, the
    guards' fields (``extra``) and, when the round was valued, phi, weights and costs."""
    ids = [u.client_id for u in parsed.updates]
    record: dict[str, Any] = {
        "selected": list(selected), "returned": ids,
        "failed": parsed.failed, "rejected": parsed.rejected, "clipped": parsed.clipped,
        "valuation": method,
    }
    if duplicates:
        record["duplicates"] = [list(g) for g in duplicates]
    record.update(extra)
    if val is not None:
        record.update(phi=dict(zip(ids, val.phi.tolist(), strict=True)),
                      phi_raw=dict(zip(ids, val.phi_raw.tolist(), strict=True)),
                      weights=dict(zip(ids, val.weights.tolist(), strict=True)),
                      n_evals=val.n_evals, valuation_seconds=val.seconds,
                      nu_empty=val.nu_empty, nu_full=val.nu_full)
    return record


def ledger_rows(server_round: int, parsed: ParsedReplies, val: RoundValuation
                ) -> list[dict[str, Any]]:
    """One ledger row per valued update."""
    return [{"client_id": u.client_id, "round": server_round, "phi": p, "phi_raw": r,
             "weight": w, "num_examples": u.num_examples}
            for u, p, r, w in zip(parsed.updates, val.phi, val.phi_raw, val.weights,
                                  strict=True)]


def round_metrics(client_metrics: Mapping[str, Any], parsed: ParsedReplies,
                  val: RoundValuation | None) -> dict[str, Any]:
    """The round's train metrics: the clients' (non-finite floats dropped), the counts of
    returned, failed and rejected replies, and ``phi/<id>``, ``weight/<id>``, ``n-evals`` and
    ``valuation-seconds`` when the round was valued."""
    metrics = {k: v for k, v in client_metrics.items()
               if not isinstance(v, float) or math.isfinite(v)}
    metrics.update({"num-returned": len(parsed.updates), "num-failed": len(parsed.failed),
                    "num-rejected": len(parsed.rejected)})
    if val is not None:
        metrics.update({"n-evals": val.n_evals, "valuation-seconds": val.seconds})
        for upd, phi, weight in zip(parsed.updates, val.phi, val.weights, strict=True):
            if math.isfinite(phi):
                metrics[f"phi/{upd.client_id}"] = float(phi)
            metrics[f"weight/{upd.client_id}"] = float(weight)
    return metrics


def client_metrics(aggregate: Callable[[list[RecordDict], str], MetricRecord],
                   weight_key: str, contents: list[RecordDict]) -> MetricRecord:
    """The clients' metrics aggregated by the strategy's ``train_metrics_aggr_fn``; replies
    whose metrics cannot be aggregated (e.g. a list where others send a number) cost only
    the round's client metrics."""
    try:
        return aggregate(contents, weight_key)
    except (TypeError, ValueError, KeyError) as err:
        log.warning("client metrics not aggregated this round: %s", err)
        return MetricRecord()
