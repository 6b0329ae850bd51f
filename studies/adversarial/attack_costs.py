"""What each attack costs each defence: paired against the clean run of the same defence.

For every finished attacked cell of a preset, the clean cell with the same defence, seed,
dataset and split (every key equal but the adversary keys) is its pair. Per (setting,
defence, attack), over seeds:

* ``loss``: clean minus attacked test accuracy (mean of the last 5 rounds, %), with its
  paired 95% t-interval; the attack is *held* when the interval's upper bound is <= 2 points;
* ``collapsed``: seeds whose accuracy fell below 20% in any of the last 10 rounds;
* ``weight_ratio``: an attacker's mean aggregation weight per round it returned an update,
  over an honest client's (1 = base rate), where the defence records weights;
* ``payout_ratio``: an attacker's mean payout share over an honest client's, from the payout
  ledger, where the defence records phi; its maximum over seeds beside the interval;
* ``clean_payout_ratio``: the same ratio for the same identities in the clean run, where they
  train honestly: what their data earns. Payouts are concentrated (the bandit returns to a few
  clients), so an attacker who holds useful data is paid above the honest mean without attacking;
  ``overpaid`` counts the seeds whose attacker was paid above an honest client (ratio > 1),
  ``attack_paid`` those of them paid above what the same identities earn honestly.

    python -m studies.adversarial.attack_costs conf/arena2-mnist.toml --results RESULTS [--out DIR]

writes ``attack-costs.csv`` (one row per seed and cell), ``attack-costs.md`` and
``attack-costs.png`` (the loss with its interval, one panel per setting).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from sim.compact import save_png
from sim.grid import app_config
from sim.presets import load_preset
from sim.results import CellResult, load_results
from sim.stats import Interval, mean_interval
from studies.adversarial.adversary_stats import cell_adversaries, ledger_stats

ADVERSARY_KEYS = ("adversary-kind", "adversary-fraction", "krum-malicious")
#: Keys that name a setting (a panel): everything else but the seed and the defence.
SETTING_KEYS = ("dataset", "alpha")
COLLAPSE_BELOW, COLLAPSE_LAST = 20.0, 10
HELD_WITHIN = 2.0


def _key(cfg: dict[str, Any]) -> str:
    """A cell's config less its adversary's keys (every ``adversary-*`` key and
    :data:`ADVERSARY_KEYS`): equal for an attacked cell and its clean pair."""
    return repr(sorted((k, v) for k, v in cfg.items()
                       if k not in ADVERSARY_KEYS and not k.startswith("adversary-")))


def attacked(cfg: dict[str, Any]) -> bool:
    return app_config(cfg).adversary_fraction > 0


def attack_name(cfg: dict[str, Any]) -> str:
    """E.g. ``boosted 10%``; a backdoor with its trigger, target and boost
    (``backdoor 20% square3 bottom-right to 0 x3``)."""
    app = app_config(cfg)
    name = f"{app.adversary_kind} {100 * app.adversary_fraction:.0f}%"
    if app.adversary_kind == "backdoor":
        name += (f" {app.adversary_trigger}{app.adversary_trigger_size} "
                 f"{app.adversary_trigger_position} to {app.adversary_target} "
                 f"x{app.adversary_boost:g}")
    return name


def collapsed(result: CellResult) -> bool:
    """Accuracy below 20% in any of the last 10 rounds."""
    rounds, acc = result.curve()
    return bool(np.any(acc[rounds > 0][-COLLAPSE_LAST:] < COLLAPSE_BELOW))


def weight_ratio(result: CellResult, adversaries: frozenset[str]) -> float:
    """Mean weight per attacker reply over mean weight per honest reply (NaN if unrecorded)."""
    adv: list[float] = []
    hon: list[float] = []
    for rec in result.rounds:
        for cid, w in (rec.get("weights") or {}).items():
            if w is not None and math.isfinite(float(w)):
                (adv if str(cid) in adversaries else hon).append(float(w))
    if not adv or not hon or np.mean(hon) <= 0:
        return math.nan
    return float(np.mean(adv) / np.mean(hon))


def seed_rows(res: dict[str, CellResult], num_partitions: int,
              variant_of: dict[str, str]) -> list[dict[str, Any]]:
    """One row per finished attacked cell with a finished clean pair."""
    clean = {}
    for r in res.values():
        cfg = r.cell.run_config
        if r.finished and not attacked(cfg):
            clean[_key(cfg)] = r
    rows = []
    for cid, r in res.items():
        cfg = r.cell.run_config
        pair = clean.get(_key(cfg))
        if not (attacked(cfg) and r.finished and pair is not None):
            continue
        adv = cell_adversaries(r, num_partitions)
        ledger = ledger_stats(r, num_partitions) if r.rounds and any(
            rec.get("phi") for rec in r.rounds) else {}
        honest = ledger_stats(pair, num_partitions, adv) if ledger and pair.rounds else {}
        acc, ref = r.last_k_accuracy(), pair.last_k_accuracy()
        rows.append({
            "setting": " ".join(f"{k}={cfg.get(k)}" for k in SETTING_KEYS),
            "defence": variant_of.get(cid, app_config(cfg).strategy),
            "attack": attack_name(cfg), "seed": app_config(cfg).seed, "cell": cid,
            "clean_cell": pair.cell.cell_id, "accuracy": acc, "clean_accuracy": ref,
            "loss": (ref - acc) if acc is not None and ref is not None else math.nan,
            "collapsed": collapsed(r), "weight_ratio": weight_ratio(r, adv),
            "payout_ratio": ledger.get("ledger_payout_ratio", math.nan),
            "clean_payout_ratio": honest.get("ledger_payout_ratio", math.nan),
        })
    return sorted(rows, key=lambda x: (x["setting"], x["attack"], x["defence"], x["seed"]))


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (setting, attack, defence): intervals over seeds."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["setting"], row["attack"], row["defence"])].append(row)
    out = []
    for (setting, attack, defence), rs in sorted(groups.items()):
        loss = mean_interval([x["loss"] for x in rs])
        payout = [x["payout_ratio"] for x in rs if math.isfinite(x["payout_ratio"])]
        clean = [c for x in rs if math.isfinite(c := x.get("clean_payout_ratio", math.nan))]
        over = [x for x in rs if x["payout_ratio"] > 1.0]
        out.append({"setting": setting, "attack": attack, "defence": defence, "n": len(rs),
                    "loss": loss, "held": loss.n > 1 and loss.hi <= HELD_WITHIN,
                    "collapsed": sum(x["collapsed"] for x in rs),
                    "weight_ratio": mean_interval([x["weight_ratio"] for x in rs]),
                    "payout_ratio": mean_interval(payout),
                    "payout_max": max(payout) if payout else math.nan,
                    "clean_payout_ratio": mean_interval(clean),
                    "overpaid": len(over),
                    "attack_paid": sum(x["payout_ratio"] > x.get("clean_payout_ratio", math.nan)
                                       for x in over)})
    return out


def _ratio_text(iv: Interval) -> str:
    return "-" if not iv.n else iv.text()


def markdown(summary: list[dict[str, Any]]) -> str:
    """One table per setting: attacks x defences, loss ± CI, collapses, ratios."""
    lines: list[str] = []
    for setting in sorted({s["setting"] for s in summary}):
        lines += [f"### {setting}", "",
                  "| attack | defence | seeds | accuracy loss vs clean (pts) | held (CI hi <= 2) "
                  "| collapsed seeds | attacker weight / honest | attacker payout / honest "
                  "(max over seeds) | same ids when clean | seeds paid > 1 (above clean) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for s in (x for x in summary if x["setting"] == setting):
            pay = _ratio_text(s["payout_ratio"])
            if math.isfinite(s["payout_max"]):
                pay += f" ({s['payout_max']:.2f})"
            lines.append(f"| {s['attack']} | {s['defence']} | {s['n']} | "
                         f"{s['loss'].text(signed=True)} | {'yes' if s['held'] else 'no'} | "
                         f"{s['collapsed']} | {_ratio_text(s['weight_ratio'])} | {pay} | "
                         f"{_ratio_text(s['clean_payout_ratio'])} | "
                         f"{s['overpaid']} ({s['attack_paid']}) |")
        lines.append("")
    return "\n".join(lines)


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    """Accuracy loss with its interval per attack, one marker per defence, a panel a setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({s["setting"] for s in summary})
    fig, axes = plt.subplots(len(settings), 1, figsize=(11, 3.6 * len(settings)),
                             squeeze=False, constrained_layout=True)
    for ax, setting in zip(axes[:, 0], settings, strict=True):
        rows = [s for s in summary if s["setting"] == setting]
        attacks = sorted({s["attack"] for s in rows})
        defences = sorted({s["defence"] for s in rows})
        width = 0.8 / max(len(defences), 1)
        for j, d in enumerate(defences):
            xs, ys, es = [], [], []
            for i, a in enumerate(attacks):
                s = next((x for x in rows if x["attack"] == a and x["defence"] == d), None)
                if s is not None and s["loss"].n:
                    xs.append(i + (j - len(defences) / 2 + 0.5) * width)
                    ys.append(s["loss"].mean)
                    es.append(0.0 if math.isnan(s["loss"].half) else s["loss"].half)
            ax.errorbar(xs, ys, yerr=es, fmt="o", capsize=3, label=d)
        ax.axhline(HELD_WITHIN, color="grey", ls="--", lw=0.8)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xticks(range(len(attacks)), attacks, rotation=20)
        ax.set_ylabel("accuracy loss vs clean (pts)")
        ax.set_title(setting)
        ax.legend(fontsize=7, ncol=4)
    save_png(fig, path, dpi=120)
    plt.close(fig)


def write(preset_path: Path, results: Path, out: Path) -> list[Path]:
    """Write the CSV, the Markdown tables and the plot; returns their paths."""
    preset = load_preset(preset_path)
    res = load_results(preset, results)
    variant_of = {c.cell_id: str(c.point.get("variant", "")) for c in preset.cells()}
    rows = seed_rows(res, preset.num_supernodes, variant_of)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "attack-costs.csv", out / "attack-costs.md", out / "attack-costs.png"]
    with paths[0].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["setting"])
        writer.writeheader()
        writer.writerows(rows)
    summary = summarise(rows)
    paths[1].write_text(f"# Attack costs: {preset.name}\n\n{markdown(summary)}")
    if summary:
        plot(summary, paths[2])
    else:
        paths.pop()
    return paths


def read_rows(path: Path, defence: str | None = None) -> list[dict[str, Any]]:
    """A committed ``attack-costs.csv``'s rows (``defence``'s only, when given), typed as
    :func:`seed_rows` makes them."""
    with path.open() as fh:
        return [{**r, "loss": float(r["loss"]), "collapsed": r["collapsed"] == "True",
                 "weight_ratio": float(r["weight_ratio"]),
                 "payout_ratio": float(r["payout_ratio"]),
                 "clean_payout_ratio": float(r.get("clean_payout_ratio") or math.nan)}
                for r in csv.DictReader(fh) if defence in (None, r["defence"])]


def _verdict(s: dict[str, Any]) -> tuple[bool, bool, bool]:
    """What the acceptance reads: held, any collapse, every seed's payout ratio <= 1."""
    return bool(s["held"]), s["collapsed"] > 0, not s["payout_max"] > 1.0


def seed_agreement(fresh: list[dict[str, Any]], development: list[dict[str, Any]],
                   labels: tuple[str, str] = ("development seeds", "fresh seeds")) -> str:
    """Markdown: per setting both grids ran and attack, the development seeds' reading beside
    the fresh seeds' (loss ± CI, held, collapses, largest payout ratio), and whether the two
    agree on all three verdicts. ``labels`` name the two columns (another defence on the same
    seeds, say)."""
    dev = {(s["setting"], s["attack"]): s for s in summarise(development)}
    lines = [f"| setting | attack | {labels[0]}: loss, held, collapsed, payout max "
             f"| {labels[1]}: loss, held, collapsed, payout max | agree |",
             "|---|---|---|---|---|"]
    for s in summarise(fresh):
        d = dev.get((s["setting"], s["attack"]))
        if d is None:
            continue
        cols = [f"{x['loss'].text(signed=True)} (n={x['n']}), {'held' if x['held'] else 'not held'}"
                f", {x['collapsed']}, {x['payout_max']:.2f}" for x in (d, s)]
        same = _verdict(d) == _verdict(s)
        lines.append(f"| {s['setting']} | {s['attack']} | {cols[0]} | {cols[1]} | "
                     f"{'yes' if same else '**no**'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path)
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--out", type=Path, default=None,
                   help="default: docs/results/<preset name>")
    p.add_argument("--versus", default=None, metavar="CSV:DEFENCE",
                   help="also write seed-agreement.md: this preset's attacked runs beside "
                        "DEFENCE's rows of another report's attack-costs.csv (e.g. the "
                        "development seeds' reading of the same defaults)")
    args = p.parse_args(argv)
    out = args.out or Path("docs/results") / load_preset(args.preset).name
    for path in write(args.preset, args.results, out):
        print(f"[attack-costs] {path}")
    if args.versus:
        csv_path, _, defence = args.versus.rpartition(":")
        development = read_rows(Path(csv_path), defence)
        if not development:
            p.error(f"--versus {args.versus}: no rows of defence {defence!r} in {csv_path}")
        fresh = read_rows(out / "attack-costs.csv")
        path = out / "seed-agreement.md"
        name = load_preset(args.preset).name
        same_seeds = {r["seed"] for r in fresh} == {r["seed"] for r in development}
        if same_seeds:  # another defence on these seeds, not another set of seeds
            title = f"# {name} beside {defence} on the same seeds"
            what = f"Beside: {defence} in {csv_path}, the same seeds"
            labels = (f"{defence}, same seeds", name)
        else:
            title = f"# Fresh against development seeds: {name}"
            what = f"Development: {defence} in {csv_path}"
            labels = ("development seeds", "fresh seeds")
        path.write_text(f"{title}\n\n{what}. They agree when both read the "
                        "same on all three of held (CI upper bound <= 2 points), any collapse "
                        "and payout ratio <= 1 in every seed; with 3-5 seeds 'held' is mostly "
                        "the width of the interval.\n\n"
                        + seed_agreement(fresh, development, labels))
        print(f"[attack-costs] {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
