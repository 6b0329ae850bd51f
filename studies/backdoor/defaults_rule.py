"""backdoor-defaults-dev's rule (conf/backdoor-defaults-dev.toml, steps 1-3; issue 72, deliver 5).

Per cell: its setting (dataset, alpha), arm, seed and attack (its grid's name before
``-lenet`` / ``-cifar10``; ``clean`` for the clean grids); validation accuracy (mean of the
last 5 rounds, %); for attacked cells the attack success (max of the last 5 rounds, %) and the
attackers' payout ratio (their mean payout share on the ledger over an honest client's:
:func:`studies.adversarial.adversary_stats.ledger_stats`). A cell the app's stall rule stopped
(:func:`server_app.stall.stall_reason` true at its last round) is scored at its last recorded
round, carried to the end; any other unfinished cell is left out (the rule then reads what is
there, and says what is missing).

The rule: an arm *holds* when in every setting and attack its mean ASR over seeds is <= 5%
and its payout ratio <= 1, and in every setting the lower end of its paired clean cost's 95%
t-interval (validation, against ``fedowen``) is >= -2 points. The pick: of the arms that hold,
the smallest mean clean cost over the settings (ties to one decimal: fewer defences, then the
first listed); none holding: of the arms meeting the cost, the one holding ASR and payout in the
most (setting, attack) pairs, when that is more than ``fedowen`` holds (ties: smaller cost);
otherwise none.

    python -m studies.backdoor.defaults_rule conf/backdoor-defaults-dev.toml --results RESULTS \\
        --out DIR

writes ``cells.csv.gz`` (one row a scored cell), ``decision.md`` (the tables, the pick, and
the pick with each attacked and each clean seed left out; beside them, reported and not
deciding, each setting's clean cost with its interval, the clean test cost, the attackers' weight
over an honest client's, honest updates rejected a round and seconds a round) and each arm's ASR
per round with the rows drawn (:mod:`studies.backdoor.curves`: ``curves.png``,
``curves.csv.gz``).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server_app.stall import stall_reason
from sim.cell_state import cell_machines
from sim.compact import open_csv
from sim.presets import load_preset
from sim.results import LAST_K, CellResult, load_results
from sim.stats import paired_interval
from studies.adversarial.adversary_stats import cell_adversaries, ledger_stats
from studies.adversarial.attack_costs import weight_ratio
from studies.backdoor.curves import write_curves

REFERENCE = "fedowen"
#: How stage 1 picked its arm, and so what stage 2 (step 4, "step 2 (a) and (c) read again")
#: asks of it at 10% attackers: ``held``, every pair held; ``fallback`` (no arm held step 2
#: and the pick held the most pairs, step 3's second branch), more pairs held than
#: ``fedowen``. Written 2026-12-06, before any score of stage 1 was read: the preset's step 4
#: does not say what a fallback pick must do at stage 2, and this reads it as step 3 again.
STAGE_2 = ("held", "fallback")
ASR_BAR, COST_BAR, PAYOUT_BAR = 5.0, -2.0, 1.0
MODEL_SUFFIXES = ("-lenet", "-cifar10")

Setting = tuple[str, float]


def attack_of(grid: str) -> str:
    """The attack a grid runs, from its name (``square-lenet`` -> ``square``)."""
    for suffix in MODEL_SUFFIXES:
        if grid.endswith(suffix):
            return grid[: -len(suffix)]
    return grid


def scored_rounds(result: CellResult) -> list[dict[str, Any]] | None:
    """The rounds a cell is scored on: all of them when finished; a stalled cell's with its
    last record carried to the end; None for a cell that neither finished nor stalled."""
    if result.finished:
        return result.rounds
    train = [r for r in result.rounds if r.get("round", 0) > 0]
    if not train or stall_reason(train, result.cell.config.max_stalled_rounds) is None:
        return None
    last = train[-1]
    carried = [{**last, "round": k} for k in range(last["round"] + 1, result.total_rounds + 1)]
    return result.rounds + carried


def cell_kernels(results: Path | None, cell_id: str) -> str:
    """The CPU kernels the cell's attempts ran on (``code.json``), ``|``-joined when a resumed
    cell ran on CPUs of other kernel flags; empty when unrecorded."""
    if results is None:
        return ""
    return "|".join(sorted({str(m.get("kernels", "")) for m in cell_machines(results / cell_id)}))


def cell_row(result: CellResult, num_partitions: int, results: Path | None = None
             ) -> dict[str, Any] | None:
    """One scored cell's row (None: not scored)."""
    rounds = scored_rounds(result)
    if rounds is None:
        return None
    train = [r for r in rounds if r.get("round", 0) > 0]
    cfg = result.cell.config
    attack = "clean" if cfg.adversary_fraction == 0 else attack_of(result.cell.grid)
    val = [100 * r["val_accuracy"] for r in train if r.get("val_accuracy") is not None]
    test = [100 * r["test_accuracy"] for r in train if r.get("test_accuracy") is not None]
    adv = cell_adversaries(result, num_partitions)
    row: dict[str, Any] = {
        "grid": result.cell.grid, "dataset": cfg.dataset, "alpha": cfg.alpha,
        "arm": str(result.cell.point.get("variant")), "seed": cfg.seed, "attack": attack,
        "val": float(np.mean(val[-LAST_K:])), "asr": math.nan, "payout_ratio": math.nan,
        "stalled": not result.finished, "cell": result.cell.cell_id,
        "kernels": cell_kernels(results, result.cell.cell_id),
        "test": float(np.mean(test[-LAST_K:])) if test else math.nan,
        "weight_ratio": math.nan, "honest_rejected": honest_rejected(result.rounds, adv),
        "seconds": mean_of(result.rounds, "round_seconds")}
    if attack != "clean":
        asr = [100 * r["attack_success"] for r in train if r.get("attack_success") is not None]
        row["asr"] = float(max(asr[-LAST_K:])) if asr else math.nan
        row["payout_ratio"] = ledger_stats(result, num_partitions).get("ledger_payout_ratio",
                                                                       math.nan)
        row["weight_ratio"] = weight_ratio(result, adv)
    return row


def honest_rejected(rounds: Sequence[Mapping[str, Any]], adversaries: frozenset[str]) -> float:
    """Honest updates rejected a training round, on average (reported, not deciding)."""
    counts = [sum(str(c) not in adversaries for c in (r.get("rejected") or {}))
              for r in rounds if r.get("round", 0) > 0]
    return float(np.mean(counts)) if counts else math.nan


def mean_of(rounds: Sequence[Mapping[str, Any]], key: str) -> float:
    """The mean of a per-round number over the training rounds that record it."""
    xs = [float(r[key]) for r in rounds if r.get("round", 0) > 0 and r.get(key) is not None]
    return float(np.mean(xs)) if xs else math.nan


@dataclass
class Reading:
    """The rule's reading of an arm over the seeds given."""

    cost: dict[Setting, tuple[float, float]] = field(default_factory=dict)  # mean, lower end
    asr: dict[tuple[Setting, str], float] = field(default_factory=dict)
    payout: dict[tuple[Setting, str], float] = field(default_factory=dict)

    def cost_ok(self) -> bool:
        return bool(self.cost) and all(lo >= COST_BAR for _, lo in self.cost.values())

    def pair_ok(self, key: tuple[Setting, str]) -> bool:
        """ASR and payout held in one (setting, attack) pair (a NaN payout: no ledger, held)."""
        pay = self.payout.get(key, math.nan)
        return self.asr[key] <= ASR_BAR and not pay > PAYOUT_BAR

    def pairs_held(self) -> int:
        return sum(self.pair_ok(k) for k in self.asr)

    def holds_attacks(self) -> bool:
        """Step 2 (a) and (c) in every pair read (stage 2: the clean cost is stage 1's)."""
        return bool(self.asr) and self.pairs_held() == len(self.asr)

    def holds(self) -> bool:
        return self.cost_ok() and self.holds_attacks()

    def mean_cost(self) -> float:
        return float(np.mean([m for m, _ in self.cost.values()])) if self.cost else math.nan


def read(rows: Sequence[Mapping[str, Any]], arm: str, attacked_seeds: Iterable[int],
         clean_seeds: Iterable[int]) -> Reading:
    """Steps 1-2 for one arm over the given seeds."""
    attacked_seeds, clean_seeds = set(attacked_seeds), set(clean_seeds)
    clean: dict[tuple[str, Setting], dict[int, float]] = defaultdict(dict)
    asr: dict[tuple[Setting, str], list[float]] = defaultdict(list)
    payout: dict[tuple[Setting, str], list[float]] = defaultdict(list)
    for r in rows:
        setting = (r["dataset"], float(r["alpha"]))
        if r["attack"] == "clean" and r["seed"] in clean_seeds:
            clean[(r["arm"], setting)][r["seed"]] = r["val"]
        elif r["attack"] != "clean" and r["arm"] == arm and r["seed"] in attacked_seeds:
            asr[(setting, r["attack"])].append(r["asr"])
            payout[(setting, r["attack"])].append(r["payout_ratio"])
    out = Reading()
    for (who, setting), vals in clean.items():
        if who == arm:
            iv = paired_interval(vals, clean.get((REFERENCE, setting), {}))
            out.cost[setting] = (iv.mean, iv.lo)
    out.asr = {k: float(np.mean(v)) for k, v in asr.items()}
    out.payout = {k: float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
                  for k, v in payout.items()}
    return out


def ranking(readings: Mapping[str, Reading], arms: Sequence[str], defences: Mapping[str, int],
            with_cost: bool = True, fallback: bool = False) -> list[str]:
    """Step 3's order over the arms (in listed order) other than the reference, among those
    read in every (setting, attack) pair and every setting any arm was read in: the arms that
    hold, by mean clean cost (ties to one decimal: fewer defences, then the first listed); none
    holding, the arms meeting the cost that hold ASR and payout in more pairs than ``fedowen``,
    by pairs held (ties: the smaller cost). Its first is the pick; stage 2 (step 4) falls back
    along it. Without ``with_cost`` (stage 2's cells, none clean) an arm holds on step 2 (a)
    and (c) alone, ties going to fewer defences; with ``fallback`` too (stage 1's pick held no
    step 2 and came from step 3's second branch), none holding, the arms that hold ASR and
    payout in more pairs than ``fedowen`` follow, by pairs held: step 3's fallback read again
    at stage 2's fraction (:data:`STAGE_2`)."""
    pairs = max(len(r.asr) for r in readings.values())
    settings = max(len(r.cost) for r in readings.values())
    candidates = [a for a in arms if a != REFERENCE  # an arm missing a pair or a setting
                  and (len(readings[a].asr), len(readings[a].cost)) == (pairs, settings)]
    floor = readings[REFERENCE].pairs_held() if REFERENCE in readings else 0
    if not with_cost:
        held = sorted([a for a in candidates if readings[a].holds_attacks()],
                      key=lambda a: (defences[a], arms.index(a)))
        if held or not fallback:
            return held
        return sorted([a for a in candidates if readings[a].pairs_held() > floor],
                      key=lambda a: (-readings[a].pairs_held(), defences[a], arms.index(a)))
    held = [a for a in candidates if readings[a].holds()]
    if held:
        return sorted(held, key=lambda a: (-round(readings[a].mean_cost(), 1), defences[a],
                                           arms.index(a)))
    best = [a for a in candidates
            if readings[a].cost_ok() and readings[a].pairs_held() > floor]
    return sorted(best, key=lambda a: (-readings[a].pairs_held(), -readings[a].mean_cost(),
                                       arms.index(a)))


def pick(readings: Mapping[str, Reading], arms: Sequence[str], defences: Mapping[str, int],
         with_cost: bool = True, fallback: bool = False) -> str | None:
    """Step 3: the first of :func:`ranking`, or None."""
    order = ranking(readings, arms, defences, with_cost, fallback)
    return order[0] if order else None


def defence_count(arm: str) -> int:
    """How many defences an arm adds on the defaults (its name's ``+``-joined parts)."""
    return 0 if arm == REFERENCE else arm.count("+") + 1


def decide(rows: Sequence[Mapping[str, Any]], arms: Sequence[str], attacked_seeds: Sequence[int],
           clean_seeds: Sequence[int], fallback: bool = False
           ) -> tuple[str | None, dict[str, Reading]]:
    """The pick and every arm's reading (``fallback``: :func:`ranking`'s, for stage 2)."""
    readings = {a: read(rows, a, attacked_seeds, clean_seeds) for a in arms}
    return pick(readings, arms, {a: defence_count(a) for a in arms}, has_clean(rows),
                fallback), readings


def has_clean(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the cells include clean ones (stage 2's have none: its rule reads step 2 (a)
    and (c) only)."""
    return any(r["attack"] == "clean" for r in rows)


def report(rows: Sequence[Mapping[str, Any]], arms: Sequence[str], attacked_seeds: Sequence[int],
           clean_seeds: Sequence[int], expected: int, name: str = "backdoor-defaults-dev",
           fallback: bool = False) -> str:
    """decision.md's text (``fallback``: stage 2 of a pick from step 3's fallback)."""
    chosen, readings = decide(rows, arms, attacked_seeds, clean_seeds, fallback)
    clean = has_clean(rows)
    floor = readings[REFERENCE].pairs_held() if REFERENCE in readings else 0
    lines = [f"# {name}: the rule's reading ({len(rows)} of {expected} cells "
             "scored)", "", *([] if clean else [
                 "No clean cells (stage 2): an arm holds on step 2 (a) and (c) alone; its clean "
                 "cost is stage 1's." + (f" Stage 1's pick came from step 3's fallback (no arm "
                 f"held), so it passes here, holding none, when it holds more pairs than "
                 f"{REFERENCE} ({floor})." if fallback else ""), ""]),
             "| arm | holds | (setting, attack) pairs held | clean cost, mean over settings "
             "| worst clean cost's lower end |", "|---|---|---:|---:|---:|"]
    deciding = REFERENCE in arms  # the fresh seeds of the defaults alone have no reference
    if not deciding:
        lines[2:2] = [f"No {REFERENCE} arm (the fresh seeds of the defaults): an arm holds on ASR "
                      "and payout alone, there is no clean cost, and no pick is made.", ""]
    for a in arms:
        rd = readings[a]
        worst = min((lo for _, lo in rd.cost.values()), default=math.nan)
        held = rd.holds() if clean and deciding else rd.holds_attacks()
        lines.append(f"| {a} | {'yes' if held else 'no'} | {rd.pairs_held()} of "
                     f"{len(rd.asr)} | {rd.mean_cost():+.2f} | {worst:+.2f} |")
    pairs = sorted({k for rd in readings.values() for k in rd.asr})
    lines += ["", "Mean ASR (%) over seeds / payout ratio, per setting and attack:", "",
              "| setting | attack | " + " | ".join(arms) + " |",
              "|---|---|" + "---:|" * len(arms)]
    for key in pairs:
        cells = [f"{readings[a].asr.get(key, math.nan):.1f} / "
                 f"{readings[a].payout.get(key, math.nan):.2f}" for a in arms]
        lines.append(f"| {key[0][0]} a{key[0][1]} | {key[1]} | " + " | ".join(cells) + " |")
    lines += [*(cost_lines(rows, arms, clean_seeds) if clean else []), *reported_lines(rows, arms)]
    if not deciding:
        return "\n".join([*lines, "", *degraded_lines(rows), *machine_lines(rows)]) + "\n"
    order = ranking(readings, arms, {a: defence_count(a) for a in arms}, clean, fallback)
    lines += ["", f"**Pick: {chosen or 'none'}**" + (f" (step 3's order, which stage 2 falls "
              f"back along: {', '.join(order)})" if order else ""), "", *degraded_lines(rows),
              *machine_lines(rows), ""]
    for label, seeds, other in (("attacked", attacked_seeds, clean_seeds),
                                ("clean", clean_seeds, attacked_seeds)):
        for out in seeds:
            keep = [s for s in seeds if s != out]
            loo = (decide(rows, arms, keep, other, fallback) if label == "attacked"
                   else decide(rows, arms, other, keep, fallback))[0]
            lines.append(f"- without {label} seed {out}: {loo or 'none'}")
    return "\n".join(lines) + "\n"


def cost_lines(rows: Sequence[Mapping[str, Any]], arms: Sequence[str], clean_seeds: Sequence[int]
               ) -> list[str]:
    """Each arm's clean cost in each setting, paired by clean seed against ``fedowen``: its mean
    and 95% interval (step 1's numbers; ``fedowen``'s column: its own mean)."""
    vals: dict[tuple[str, Setting], dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["attack"] == "clean" and r["seed"] in set(clean_seeds):
            vals[(r["arm"], (r["dataset"], float(r["alpha"])))][r["seed"]] = float(r["val"])
    settings = sorted({s for _, s in vals})
    out = ["", f"Clean cost (validation points against {REFERENCE}, paired by clean seed; mean "
           f"[95% interval]; {REFERENCE}: its mean):", "",
           "| setting | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
    for setting in settings:
        ref = vals.get((REFERENCE, setting), {})
        cells = []
        for a in arms:
            mine = vals.get((a, setting), {})
            if a == REFERENCE:
                cells.append(f"{np.mean(list(ref.values())):.2f}" if ref else "")
            elif mine and ref:
                iv = paired_interval(mine, ref)
                cells.append(f"{iv.mean:+.2f} [{iv.lo:+.2f}, {iv.hi:+.2f}]")
            else:
                cells.append("")
        out.append(f"| {setting[0]} a{setting[1]} | " + " | ".join(cells) + " |")
    return out


def shown(x: float, spec: str) -> str:
    """``x`` formatted, or a dash where there is nothing to show (NaN)."""
    return format(x, spec) if math.isfinite(x) else "-"


def reported_lines(rows: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[str]:
    """The preset's reported, not deciding numbers, per arm: the clean test cost (mean over the
    settings of the paired mean), the attackers' weight over an honest client's, honest updates
    rejected a round (clean and attacked cells) and seconds a round."""
    def mean(xs: Iterable[Any]) -> float:
        kept = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
        return float(np.mean(kept)) if kept else math.nan

    test: dict[tuple[str, Setting], dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["attack"] == "clean" and "test" in r:
            test[(r["arm"], (r["dataset"], float(r["alpha"])))][int(r["seed"])] = float(r["test"])
    out = ["", "Reported, not deciding (means over the arm's cells):", "",
           "| arm | clean test cost | attackers' weight / honest | honest rejected a round, "
           "clean / attacked | seconds a round |", "|---|---:|---:|---:|---:|"]
    for a in arms:
        mine = [r for r in rows if r["arm"] == a]
        clean = [r for r in mine if r["attack"] == "clean"]
        hit = [r for r in mine if r["attack"] != "clean"]
        costs = [paired_interval(v, test[(REFERENCE, s)]).mean for (who, s), v in test.items()
                 if who == a and a != REFERENCE and test.get((REFERENCE, s))]
        out.append(f"| {a} | {shown(mean(costs), '+.2f')} "
                   f"| {shown(mean(r.get('weight_ratio') for r in hit), '.2f')} "
                   f"| {shown(mean(r.get('honest_rejected') for r in clean), '.2f')} / "
                   f"{shown(mean(r.get('honest_rejected') for r in hit), '.2f')} "
                   f"| {shown(mean(r.get('seconds') for r in mine), '.2f')} |")
    return out


#: An attacked cell this many validation points under its arm's clean mean in its setting is
#: named as degraded (reported, not deciding: a model the attack broke can read as held).
DEGRADED_POINTS = 10.0


def degraded_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The attacked cells whose validation accuracy is :data:`DEGRADED_POINTS` or more under
    the mean of their arm's clean cells in their setting: an attack that broke the model (at
    chance, its ASR may read 0) is named here, beside the rule, which reads ASR."""
    clean: dict[tuple[str, float, str], list[float]] = defaultdict(list)
    for r in rows:
        if r["attack"] == "clean":
            clean[(r["dataset"], float(r["alpha"]), r["arm"])].append(float(r["val"]))
    low = []
    for r in rows:
        ref = clean.get((r["dataset"], float(r["alpha"]), r["arm"]))
        if r["attack"] != "clean" and ref and float(r["val"]) <= np.mean(ref) - DEGRADED_POINTS:
            low.append(f"{r['arm']} {r['dataset']} a{r['alpha']} {r['attack']} seed "
                       f"{r['seed']}: {float(r['val']):.1f} against {np.mean(ref):.1f} clean "
                       f"(ASR {float(r['asr']):.1f})")
    head = (f"Attacked cells {DEGRADED_POINTS:g} or more validation points under their arm's "
            f"clean mean (reported, not deciding): {len(low)}" + (":" if low else "."))
    return [head, *(f"- {line}" for line in low), ""]


def machine_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where the cells ran: the kernels' counts, and the clean pairs whose two cells (an arm and
    the reference, one setting and seed) ran on CPUs of other kernel flags (AVX2 kernels pinned
    on all, as the preset says; reported, not deciding)."""
    kinds: dict[str, int] = defaultdict(int)
    for r in rows:
        kinds[r.get("kernels") or "unrecorded"] += 1
    clean = {(r["dataset"], r["alpha"], r["seed"], r["arm"]): r.get("kernels") for r in rows
             if r["attack"] == "clean"}
    pairs = [k for k in clean if k[3] != REFERENCE and (*k[:3], REFERENCE) in clean]
    straddle = [k for k in pairs if clean[k] != clean[(*k[:3], REFERENCE)]]
    return ["Cells by the CPU kernels they ran on: " + "; ".join(
                f"{k}: {n}" for k, n in sorted(kinds.items())) + ".",
            f"Clean pairs whose two cells ran on CPUs of other kernel flags: {len(straddle)} of "
            f"{len(pairs)}" + (f" {straddle}" if straddle else "") + "."]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("preset", type=Path)
    p.add_argument("--results", type=Path, required=True, help="the preset's results folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--stage-1", choices=STAGE_2, default="held",
                   help="stage 2's reading (no clean cells): how stage 1's decision.md picked "
                   "the arm, 'held' (it held step 2) or 'fallback' (none held: step 3's "
                   "second branch); the check read again at stage 2's fraction")
    args = p.parse_args(argv)
    preset = load_preset(args.preset)
    results = load_results(preset, args.results)
    rows = [row for r in results.values()
            if (row := cell_row(r, preset.num_supernodes, args.results)) is not None]
    if not rows:
        raise SystemExit(f"no finished or stalled cell under {args.results}: run the preset "
                         f"first (python -m sim.experiments run {args.preset})")
    arms = list(dict.fromkeys(str(c.point.get("variant")) for c in preset.cells()))
    attacked = sorted({c.config.seed for c in preset.cells() if c.config.adversary_fraction > 0})
    clean = sorted({c.config.seed for c in preset.cells() if c.config.adversary_fraction == 0})
    args.out.mkdir(parents=True, exist_ok=True)
    with open_csv(args.out / "cells.csv.gz", "w") as fh:
        fields = list(rows[0])
        fh.write(",".join(fields) + "\n")
        for row in sorted(rows, key=lambda x: (x["grid"], x["dataset"], x["alpha"], x["arm"],
                                               x["seed"])):
            fh.write(",".join(str(row[k]) for k in fields) + "\n")
    text = report(rows, arms, attacked, clean, len(results), preset.name,
                  fallback=args.stage_1 == "fallback")
    (args.out / "decision.md").write_text(text)
    write_curves(results, arms, args.out, attack_of)
    print(text)


if __name__ == "__main__":
    main()
