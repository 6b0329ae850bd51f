"""Sybil links measured: the honest pairs' cosines, false links and caught copies.

FedOwen records every round's pairwise cosine similarities of the updates (``cosines``, the
upper triangle in the order of ``returned``) and the groups it linked at ``link-cosine``
(``links``). From a preset's results this module reports, per finished FedOwen cell:

* the honest pairs' cosine distribution (both clients honest): the distribution the
  threshold is taken from, pooled over a setting's clean cells (quantiles and maximum);
* the adversaries' pairs (both adversarial), e.g. colluding Sybils' copies;
* the false-link rate: honest client-rounds that were linked to anyone, over all honest
  client-rounds, in cells whose ``link-cosine`` is on; and what the links cost the falsely
  linked clients: their payout share beside the same clients' in the paired cell without
  links (same settings and seed, ``link-cosine = 0``), where one ran;
* the catch rate: adversary client-rounds linked, over those in rounds where two or more
  adversaries returned.

    python -m studies.adversarial.sybil_links conf/defaults-dev-mnist.toml --results RESULTS \\
        [--out DIR]

writes ``sybil-links.csv`` (one row per cell), ``sybil-links.md`` and ``sybil-links.png``
(the pooled honest and adversarial cosines, the thresholds in force).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedowen_strategy.payouts import client_values, payouts
from sim.compact import save_png
from sim.presets import load_preset
from sim.results import CellResult, load_results
from studies.adversarial.adversary_stats import cell_adversaries

QUANTILES = (0.5, 0.9, 0.99, 0.999)
THRESHOLDS = (0.9, 0.95, 0.97, 0.98, 0.99)


def pair_cosines(rounds: Iterable[dict[str, Any]], adversaries: frozenset[str]
                 ) -> tuple[list[float], list[float], int]:
    """(honest-honest cosines, adversary-adversary cosines, rounds whose ``cosines`` did not
    match ``returned`` and were skipped) over the recorded rounds."""
    honest: list[float] = []
    bad: list[float] = []
    skipped = 0
    for rec in rounds:
        cos, ids = rec.get("cosines"), rec.get("returned") or []
        if not cos:
            continue
        n = len(ids)
        if len(cos) != n * (n - 1) // 2:
            skipped += 1
            continue
        k = 0
        for i in range(n):
            for j in range(i + 1, n):
                a, b = str(ids[i]) in adversaries, str(ids[j]) in adversaries
                if not a and not b:
                    honest.append(float(cos[k]))
                elif a and b:
                    bad.append(float(cos[k]))
                k += 1
    return honest, bad, skipped


@dataclass
class LinkCounts:
    """Client-rounds of a cell: honest ones and those linked (false links), adversaries' in
    rounds where two or more returned and those linked (catches)."""

    honest_rounds: int = 0
    honest_linked: int = 0
    adv_rounds: int = 0
    adv_linked: int = 0
    rounds_with_links: int = 0
    false_clients: set[str] = field(default_factory=set)


def link_counts(rounds: Iterable[dict[str, Any]], adversaries: frozenset[str]) -> LinkCounts:
    """Honest and adversary client-rounds, those linked, and the falsely linked clients."""
    out = LinkCounts()
    for rec in rounds:
        ids = [str(c) for c in rec.get("returned") or []]
        linked = {str(c) for g in rec.get("links") or [] for c in g}
        out.rounds_with_links += bool(linked)
        honest = [c for c in ids if c not in adversaries]
        out.honest_rounds += len(honest)
        false = [c for c in honest if c in linked]
        out.honest_linked += len(false)
        out.false_clients.update(false)
        bad = [c for c in ids if c in adversaries]
        if len(bad) >= 2:
            out.adv_rounds += len(bad)
            out.adv_linked += sum(c in linked for c in bad)
    return out


def payout_shares(result: CellResult) -> dict[str, float]:
    recs = [r for r in result.rounds if r.get("round", 0) > 0]
    values, selected = client_values(recs)
    return {p.client_id: p.payout_share for p in payouts(values, selected)}


def _pair_key(cfg: dict[str, Any]) -> str:
    return repr(sorted((k, v) for k, v in cfg.items() if k != "link-cosine"))


def cell_rows(res: dict[str, CellResult], num_partitions: int,
              variant_of: dict[str, str]
              ) -> tuple[list[dict[str, Any]], dict[str, dict[str, list[float]]]]:
    """One row per finished FedOwen cell, and the pooled cosines per (setting, attack)."""
    unlinked = {_pair_key(r.cell.run_config): r for r in res.values()
                if r.finished and float(r.cell.run_config.get("link-cosine", 0.0)) == 0.0}
    rows: list[dict[str, Any]] = []
    pooled: dict[str, dict[str, list[float]]] = {}
    for cid, r in sorted(res.items(), key=lambda kv: kv[1].cell.label()):
        cfg = r.cell.run_config
        if not r.finished or cfg.get("strategy", "fedowen") != "fedowen":
            continue
        adv = cell_adversaries(r, num_partitions)
        honest, bad, skipped = pair_cosines(r.rounds, adv)
        if not honest and not bad:
            continue
        kind = cfg.get("adversary-kind") if float(cfg.get("adversary-fraction", 0)) > 0 else "none"
        setting = f"dataset={cfg.get('dataset')} alpha={cfg.get('alpha')} attack={kind}"
        pool = pooled.setdefault(setting, {"honest": [], "adversary": []})
        pool["honest"] += honest
        pool["adversary"] += bad
        links = link_counts(r.rounds, adv)
        threshold = float(cfg.get("link-cosine", 0.0))
        cost = math.nan
        pair = unlinked.get(_pair_key(cfg))
        if threshold > 0 and links.false_clients and pair is not None:
            with_links, without = payout_shares(r), payout_shares(pair)
            # summed in a fixed order: a set's order moves with PYTHONHASHSEED
            cost = float(sum(without.get(c, 0.0) - with_links.get(c, 0.0)
                             for c in sorted(links.false_clients)))
        rows.append({
            "cell": cid, "defence": variant_of.get(cid, "fedowen"), "setting": setting,
            "seed": int(cfg.get("seed", 0)), "link_cosine": threshold,
            "honest_pairs": len(honest), "honest_max": max(honest, default=math.nan),
            "honest_q999": float(np.quantile(honest, 0.999)) if honest else math.nan,
            "adversary_pairs": len(bad),
            "adversary_median": float(np.median(bad)) if bad else math.nan,
            "adversary_min": min(bad, default=math.nan), "skipped_rounds": skipped,
            "rounds_with_links": links.rounds_with_links,
            "false_link_rate": _rate(links.honest_linked, links.honest_rounds),
            "falsely_linked_clients": len(links.false_clients),
            "payout_share_lost": cost,
            "catch_rate": _rate(links.adv_linked, links.adv_rounds),
        })
    return rows, pooled


def _rate(k: int, n: int) -> float:
    return k / n if n else math.nan


def _fmt(x: float, spec: str = ".3f") -> str:
    return "-" if not math.isfinite(x) else format(x, spec)


def markdown(rows: list[dict[str, Any]], pooled: dict[str, dict[str, list[float]]]) -> str:
    lines = ["### Pairwise cosines of the updates, pooled over cells and rounds", "",
             "| setting | pairs | " + " | ".join(f"q{q:g}" for q in QUANTILES) + " | max | "
             + " | ".join(f"> {t:g}" for t in THRESHOLDS) + " |",
             "|---" * (3 + len(QUANTILES) + len(THRESHOLDS)) + "|"]
    for setting, pool in sorted(pooled.items()):
        for who in ("honest", "adversary"):
            xs = np.asarray(pool[who])
            if xs.size == 0:
                continue
            qs = " | ".join(f"{np.quantile(xs, q):.3f}" for q in QUANTILES)
            above = " | ".join(str(int((xs > t).sum())) for t in THRESHOLDS)
            lines.append(f"| {setting}, {who} pairs | {xs.size} | {qs} | {xs.max():.3f} | "
                         f"{above} |")
    lines += ["", "### Links per cell", "",
              "| defence | setting | seed | link-cosine | honest max cos | false-link rate | "
              "falsely linked clients | their payout share lost | adversary median cos | "
              "catch rate |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['defence']} | {r['setting']} | {r['seed']} | {r['link_cosine']:g} "
                     f"| {_fmt(r['honest_max'])} | {_fmt(r['false_link_rate'], '.4f')} | "
                     f"{r['falsely_linked_clients']} | {_fmt(r['payout_share_lost'], '.4f')} | "
                     f"{_fmt(r['adversary_median'])} | {_fmt(r['catch_rate'], '.3f')} |")
    return "\n".join(lines) + "\n"


def plot(pooled: dict[str, dict[str, list[float]]], thresholds: set[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    bins = [float(b) for b in np.linspace(-1, 1, 201)]
    honest = np.asarray([x for p in pooled.values() for x in p["honest"]])
    bad = np.asarray([x for p in pooled.values() for x in p["adversary"]])
    if honest.size:
        ax.hist(honest, bins=bins, alpha=0.6, label=f"honest pairs ({honest.size})")
    if bad.size:
        ax.hist(bad, bins=bins, alpha=0.6, label=f"adversary pairs ({bad.size})")
    for t in sorted(thresholds):
        ax.axvline(t, color="k", ls="--", lw=1, label=f"link-cosine {t:g}")
    ax.set_yscale("log")
    ax.set_xlabel("cosine similarity of two updates in one round")
    ax.set_ylabel("pairs")
    ax.legend(fontsize=8)
    save_png(fig, path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path)
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    preset = load_preset(args.preset)
    res = load_results(preset, args.results)
    variant_of = {c.cell_id: str(c.point.get("variant", "")) for c in preset.cells()}
    rows, pooled = cell_rows(res, preset.num_supernodes, variant_of)
    out = args.out or Path("docs/results") / preset.name
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        with (out / "sybil-links.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    (out / "sybil-links.md").write_text(markdown(rows, pooled))
    plot(pooled, {r["link_cosine"] for r in rows if r["link_cosine"] > 0},
         out / "sybil-links.png")
    print(f"[sybil-links] {len(rows)} cells -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
