"""How close do honest updates come to each other, and where do Sybil copies lie?

``duplicate-tolerance`` calls two updates near-duplicates when
``||d_i - d_j|| <= tol * max(||d_i||, ||d_j||)`` (deltas to the global model). This runs real
cells on the inline backend (the ServerApp and ClientApp code of ``flwr run``) and records,
every round, that relative distance for every pair of returned updates, split into pairs of
two honest clients, two adversaries (Sybil copies of one actor) and mixed pairs. It reports
the quantiles of each and, per tolerance, the share of rounds in which some honest pair would
be flagged (a false positive: their weights would be shared) and the share of adversary pairs
that would be caught.

    PYTHONPATH=. python benchmarks/bench_duplicates.py --rounds 30 --seeds 0 1 \
        --out-json docs/results/duplicates/duplicates.json --out-md table.md
    PYTHONPATH=. python benchmarks/bench_duplicates.py --records results/ablation-mnist
    PYTHONPATH=. python benchmarks/bench_duplicates.py --records OLD_SWEEP --against NEW_SWEEP
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import machine_info, markdown_table, write_outputs
from fedowen_strategy.updates import update_keys

TOLERANCES = (0.05, 0.01, 1e-3, 1e-4, 1e-6)


def relative_distances(states: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray]
                       ) -> dict[tuple[int, int], float]:
    """``||d_i - d_j|| / max(||d_i||, ||d_j||)`` for every pair; NaN where either update is
    unchanged (zero: never a copy, :func:`fedowen_strategy.defences.links.duplicate_groups`)."""
    keys = update_keys(reference)
    deltas = np.stack([np.concatenate([(np.asarray(s[k], np.float64) - reference[k]).ravel()
                                       for k in keys]) for s in states])
    norms = np.linalg.norm(deltas, axis=1)
    out = {}
    for i, j in itertools.combinations(range(len(states)), 2):
        scale = max(norms[i], norms[j])
        unchanged = min(norms[i], norms[j]) == 0
        out[(i, j)] = math.nan if unchanged else float(np.linalg.norm(deltas[i] - deltas[j])
                                                       / scale)
    return out


def run_setting(run_config: dict[str, Any], num_clients: int) -> list[dict[str, Any]]:
    """Run one cell, recording every round's pairwise distances by client id."""
    # the links defence calls it by the name it imports (the round's copy check)
    import fedowen_strategy.defences.sybil_links as strategy_module
    from sim.inline import run_cell

    recorded: list[dict[str, Any]] = []
    original = strategy_module.duplicate_groups

    def spy(states: Any, reference: Any, *args: Any, **kwargs: Any) -> Any:
        recorded.append({"pairs": relative_distances(list(states), reference)})
        return original(states, reference, *args, **kwargs)

    strategy_module.duplicate_groups = spy
    try:
        run_cell(run_config, num_clients)
    finally:
        strategy_module.duplicate_groups = original
    rounds = [json.loads(line) for line in
              (Path(run_config["output-dir"]) / "rounds.jsonl").read_text().splitlines()]
    aggregated = [r for r in rounds if r.get("selected") and r.get("round", 0) > 0]
    for rec, rnd in zip(recorded, aggregated, strict=False):
        rec["ids"] = sorted(rnd["weights"], key=lambda c: (len(c), c))
    return recorded


def summarise(recorded: list[dict[str, Any]], adversaries: frozenset[int]) -> dict[str, Any]:
    """Pair distances by kind, and per tolerance the false-positive rounds and caught pairs."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    honest_min = []
    unchanged = 0
    for rec in recorded:
        ids = [int(c) for c in rec["ids"]]
        round_honest = []
        for (i, j), dist in rec["pairs"].items():
            if math.isnan(dist):
                unchanged += 1
                continue
            bad = (ids[i] in adversaries) + (ids[j] in adversaries)
            kind = ("honest", "mixed", "adversary")[bad]
            by_kind[kind].append(dist)
            if kind == "honest":
                round_honest.append(dist)
        if round_honest:
            honest_min.append(min(round_honest))
    out: dict[str, Any] = {"rounds": len(recorded), "pairs_with_an_unchanged_update": unchanged}
    for kind, dists in by_kind.items():
        arr = np.asarray(dists)
        out[kind] = {"pairs": int(arr.size),
                     "quantiles": {q: float(np.quantile(arr, q)) for q in (0.0, 0.001, 0.01, 0.5)}}
    honest_min_arr = np.asarray(honest_min)
    out["false_positive_rounds"] = {str(t): float((honest_min_arr <= t).mean())
                                    for t in TOLERANCES} if honest_min else {}
    adv = np.asarray(by_kind.get("adversary", []))
    out["adversary_pairs_caught"] = {str(t): float((adv <= t).mean()) for t in TOLERANCES
                                     } if adv.size else {}
    return out


def recorded_groups(results_dir: Path) -> str:
    """Markdown table: how often a finished sweep's records flagged near-duplicates, per
    (alpha, scheme, valuation, aggregation), and for equal-weight cells how far the applied
    weights were from equal (mean total-variation distance per round)."""
    rows: dict[tuple[Any, ...], list[tuple[int, float, float]]] = defaultdict(list)
    for cfg_path in sorted(results_dir.glob("*/config.json")):
        cfg = json.loads(cfg_path.read_text())
        if not (cfg_path.parent / "summary.json").exists():
            continue
        flagged, grouped, tv = 0, [], []
        for line in (cfg_path.parent / "rounds.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if not rec.get("weights"):
                continue
            groups = rec.get("duplicates") or []
            flagged += bool(groups)
            grouped.append(sum(len(g) for g in groups))
            w = np.array(list(rec["weights"].values()), dtype=float)
            tv.append(0.5 * float(np.abs(w - 1 / w.size).sum()))
        key = (cfg["alpha"], cfg["partition_scheme"], cfg["valuation"], cfg["selection"],
               cfg["aggregation"])
        rows[key].append((flagged, float(np.mean(grouped)), float(np.mean(tv))))
    headers = ["alpha", "scheme", "valuation", "selection", "aggregation", "cells",
               "rounds with a group (mean, max)", "clients grouped per round",
               "TV from equal weights (equal-weight cells)"]
    table = []
    for key, vals in sorted(rows.items(), key=str):
        arr = np.array(vals)
        tv = f"{arr[:, 2].mean():.3f} (max {arr[:, 2].max():.3f})" if key[4] == "uniform" \
            and key[2] == "none" else "-"
        table.append([*key, len(vals), f"{arr[:, 0].mean():.1f}, {arr[:, 0].max():.0f}",
                      f"{arr[:, 1].mean():.2f}", tv])
    return markdown_table(headers, table)


def final_accuracies(results_dir: Path) -> dict[tuple[Any, ...], float]:
    """(valuation, selection, aggregation, alpha, scheme, momentum, seed) -> final accuracy (%)
    of every finished cell of a sweep."""
    out = {}
    for cfg_path in sorted(results_dir.glob("*/config.json")):
        if not (cfg_path.parent / "summary.json").exists():
            continue
        cfg = json.loads(cfg_path.read_text())
        last = json.loads((cfg_path.parent / "rounds.jsonl").read_text().splitlines()[-1])
        key = (cfg["valuation"], cfg["selection"], cfg["aggregation"], cfg["alpha"],
               cfg["partition_scheme"], cfg["momentum"], cfg["seed"])
        out[key] = 100.0 * last["test_accuracy"]
    return out


def compare_sweeps(with_rule: Path, without_rule: Path) -> str:
    """Markdown table: the same cells (config and seed) run with and without the rule."""
    a, b = final_accuracies(with_rule), final_accuracies(without_rule)
    table = [[*k[:5], k[6], f"{a[k]:.1f}", f"{b[k]:.1f}", f"{b[k] - a[k]:+.1f}"]
             for k in sorted(set(a) & set(b), key=str)]
    return markdown_table(["valuation", "selection", "aggregation", "alpha", "scheme", "seed",
                           "with the rule", "without", "difference"], table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--schemes", nargs="+", default=["per-class", "per-client"])
    parser.add_argument("--sybil-fraction", type=float, default=0.2,
                        help="one extra cell per alpha with this fraction of `sybil` clients")
    parser.add_argument("--records", type=Path,
                        help="instead of running: summarise the duplicates a finished sweep's "
                        "records flagged (a results dir of cells) and exit")
    parser.add_argument("--against", type=Path,
                        help="with --records: a second sweep of the same cells run without the "
                        "rule; prints both final accuracies per cell")
    parser.add_argument("--out-json")
    parser.add_argument("--out-md")
    args = parser.parse_args()
    if args.records:
        table = (compare_sweeps(args.records, args.against) if args.against
                 else recorded_groups(args.records))
        write_outputs({}, table, None, args.out_md)
        return

    from fedowen_task.adversary.keys import adversary_ids

    settings = [(a, s, seed, "honest") for a in args.alphas for s in args.schemes
                for seed in args.seeds]
    settings += [(a, "per-client", seed, "sybil") for a in args.alphas for seed in args.seeds]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for alpha, scheme, seed, kind in settings:
            run_config = {
                "dataset": "mnist", "num-server-rounds": args.rounds, "clients-per-round": 10,
                "alpha": alpha, "partition-scheme": scheme, "seed": seed,
                "imbalance-factor": 0.01, "valuation": "none", "aggregation": "uniform",
                "selection": "random", "duplicate-tolerance": 0.05,
                "output-dir": f"{tmp}/{kind}-{alpha}-{scheme}-{seed}"}
            adversaries: frozenset[int] = frozenset()
            if kind == "sybil":
                run_config.update({"adversary-kind": "sybil",
                                   "adversary-fraction": args.sybil_fraction})
                adversaries = adversary_ids(args.clients, args.sybil_fraction, seed)
            recorded = run_setting(run_config, args.clients)
            row = {"alpha": alpha, "partition-scheme": scheme, "seed": seed, "clients": kind,
                   **summarise(recorded, adversaries)}
            results.append(row)
            print(json.dumps(row), flush=True)

    headers = ["clients", "alpha", "scheme", "seed", "honest pairs: min / 0.1% / 1% / median"]
    headers += [f"rounds with an honest pair <= {t}" for t in TOLERANCES]
    headers += ["Sybil pairs caught at 1e-6", "pairs with an unchanged update"]
    rows = []
    for r in results:
        q = r["honest"]["quantiles"]
        rows.append([r["clients"], r["alpha"], r["partition-scheme"], r["seed"],
                     " / ".join(f"{q[k]:.3g}" for k in (0.0, 0.001, 0.01, 0.5))]
                    + [f"{r['false_positive_rounds'][str(t)]:.2f}" for t in TOLERANCES]
                    + [f"{r['adversary_pairs_caught'].get('1e-06', float('nan')):.2f}",
                       r["pairs_with_an_unchanged_update"]])
    table = (f"MNIST, IF 0.01, {args.clients} clients, 10 per round, {args.rounds} rounds, "
             "random selection, equal weights; relative distance "
             "||d_i - d_j|| / max(||d_i||, ||d_j||) of every pair of a round's updates.\n\n"
             + markdown_table(headers, rows))
    write_outputs({"machine": machine_info(), "args": vars(args), "results": results}, table,
                  args.out_json, args.out_md)


if __name__ == "__main__":
    main()
