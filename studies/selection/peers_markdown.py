"""The selection-peers-dev reading, ``selection.md`` (:mod:`.peers_report` writes it): what is
missing, the anchor, per setting the rule's steps 1-3 and every arm's table, step 4 over the
settings and step 5 (leave one seed out)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sim.results import LAST_K
from sim.stats import Interval
from studies.selection.peers_rule import CONTENDERS, NEW_PEERS, RANDOM, Reading

if TYPE_CHECKING:
    from sim.grid import Preset
    from studies.selection.peers_data import SettingData

#: The arm table's cost columns: (selection-arms.csv key, heading, format).
COST_COLUMNS = (("n_evals", "evals", "{:.1f}"), ("valuation_seconds", "valuation s", "{:.3f}"),
                ("selector_seconds", "selector s", "{:.4f}"),
                ("extra_messages", "messages", "{:.1f}"), ("round_seconds", "round s", "{:.2f}"))


def markdown(preset: Preset, found: Sequence[SettingData], rows: Sequence[dict[str, Any]],
             reading: Reading, loo: Mapping[str, tuple[str, int]], seeds: int, done: int,
             total: int, command: str, header_best: Mapping[str, str],
             aside: Sequence[str] = ()) -> str:
    """The whole page (``aside``: the cells deviation 1 set aside)."""
    decided = [d.name for d in found if d.decided]
    state = "complete" if done == total else f"partial: {done} of {total} cells finished"
    out = [f"# {preset.name}: the rule's reading ({state})", "", preset.description, "",
           f"- Produced by: `{command}`.",
           f"- Cells of this grid finished: {done} of {total}; arms reused from selection-dev's "
           "committed records (conf/selection-dev.toml, docs/results/selection-dev): fedowen, "
           "fedavg-equal and its tuned best of Power-of-Choice and Oort, in settings where the "
           "anchor reproduces.",
           "- Settings the rule reads (every cell finished, anchor reproduced): "
           + (", ".join(decided) if decided else "none yet") + "."]
    if aside:
        out += [f"- Set aside (the preset's deviation 1: ran before the step-scale fix), read "
                f"as missing: {len(aside)} cells ({', '.join(sorted(aside))})."]
    out += [""]
    if done < total or len(decided) < len(found):
        out += ["A partial reading: a setting with a missing cell, or whose anchor has not "
                "reproduced, decides nothing (its finished cells are shown); no default is "
                f"adopted until all {len(found)} settings are read.", ""]
    out += [f"Accuracy (%): the mean of the last {LAST_K} rounds (96-100), over the seeds "
            "finished, ± the 95% t-interval's half-width; differences paired by seed. `val` "
            "(validation split) decides, `test` is reported, never used. Distinct: share of "
            "the 100 clients selected at least once. Costs a training round, averaged over "
            "rounds and seeds, `-` where the records carry none: the valuation's game "
            "evaluations and seconds, the selector's own seconds and extra messages "
            "(Power-of-Choice's loss queries), the round's wall seconds (selection-dev's arms "
            "ran on other machines and commits: compare its seconds loosely).", ""]
    out += missing_section(found) + anchor_section(found, header_best)
    for d in found:
        out += setting_section(d, [r for r in rows if r["setting"] == d.name], reading)
    out += rule_section(found, reading) + loo_section(loo, seeds)
    return "\n".join(out)


def missing_section(found: Sequence[SettingData]) -> list[str]:
    """Per setting, the cells not finished: the arms missing the same seeds together."""
    out = ["## Cells missing", ""]
    for d in found:
        seeds_of: dict[str, list[str]] = {}
        for label in d.missing:
            arm, _, seed = label.rpartition(" seed=")
            seeds_of.setdefault(arm, []).append(seed)
        arms_of: dict[str, list[str]] = {}
        for arm, seeds in seeds_of.items():
            key = "all seeds" if len(seeds) == len(d.seeds) else "seeds " + ", ".join(seeds)
            arms_of.setdefault(key, []).append(arm)
        what = "; ".join(f"{key} of " + ("every arm here" if sorted(arms) == sorted(d.arms)
                                          else ", ".join(arms))
                         for key, arms in arms_of.items())
        out.append(f"- {d.name}: " + (f"{len(d.missing)} missing: {what}" if what else "none"))
    return [*out, ""]


def anchor_section(found: Sequence[SettingData], header_best: Mapping[str, str]) -> list[str]:
    """The anchor check per setting (the seeds finished here in a table; every seed in
    anchor.csv) and selection-dev's tuned best as read."""
    out = ["## The anchor", "",
           "fedowen-random here against selection-dev's same cells: the final round's "
           "validation / test accuracy (%), equal in every seed or the setting's reference "
           "arms run again here. Commits: those the cell ran at (`selection-anchor.csv`: "
           "every seed).", ""]
    out += [f"- {d.name}: {d.anchor.status}" + (
        "" if d.anchor.status == "not needed" else
        f", {sum(r['same'] is True for r in d.anchor.seeds)} of {len(d.anchor.seeds)} seeds "
        "reproduced") for d in found]
    out += anchor_table(found, "selection-dev")
    out += ["", "selection-dev's tuned best of Power-of-Choice and Oort, read from its "
            "records: " + "; ".join(
                f"{d.name} {d.reference_peer or 'not read'}"
                + ("" if d.reference_peer in (None, header_best.get(d.name))
                   else f" (**the preset's header says {header_best.get(d.name)}**)")
                for d in found) + ".", ""]
    return out


def anchor_table(found: Sequence[SettingData], there: str) -> list[str]:
    """The anchor's seeds finished here, a row each, against ``there`` (the grid reused)."""
    ran = [(d, r) for d in found for r in d.anchor.seeds if r["here"] is not None]
    if not ran:
        return []
    out = ["", f"| setting | seed | here | {there} | same | commits here | commits {there} |",
           "|---|---|---|---|---|---|---|"]
    for d, r in ran:
        same = {None: "-", True: "yes", False: "**no**"}[r["same"]]
        out.append(f"| {d.name} | {r['seed']} | {accuracy_pair(r['here'])} | "
                   f"{accuracy_pair(r['there'])} | {same} | {r['commits_here']} | "
                   f"{r['commits_there']} |")
    return out


def accuracy_pair(values: tuple[float, float] | None) -> str:
    """A cell's final (validation, test) accuracy as ``val / test`` in %, ``-`` without."""
    return "-" if values is None else f"{100 * values[0]:.2f} / {100 * values[1]:.2f}"


def setting_section(d: SettingData, rows: Sequence[dict[str, Any]], reading: Reading
                    ) -> list[str]:
    """One setting: why it is not read (if so), steps 1-3, the arms' table."""
    out = [f"## {d.name}", ""]
    if d.anchor.status == "differs":
        out += ["The anchor **differs** from selection-dev (above): this setting's reference "
                "arms must run again here (their variants copied from selection-dev) before "
                "it is read; it is not compared, and only this grid's arms are shown.", ""]
    elif not d.decided:
        out += [f"Not read yet: {len(d.missing)} cell(s) missing"
                + ("" if d.anchor.holds else f", anchor {d.anchor.status}") + ".", ""]
    else:
        s = d.setting
        tuned = reading.tuned[d.name]
        out += ["Step 1, peers tuned on val: " + "; ".join(
            f"{family} **{tuned[family]}** ("
            + ", ".join(f"{a} {s.mean(a):.2f}" for a in arms) + ")"
            for family, arms in NEW_PEERS.items()) + ".",
            "", f"Step 2, best peer: **{reading.best[d.name]}** "
            f"(val {s.mean(reading.best[d.name]):.2f}; selection-dev's tuned best of "
            f"Power-of-Choice and Oort: {d.reference_peer}).", "",
            "Step 3: " + "; ".join(
                f"{arm} " + ("passes" if d.name not in reading.failing(arm) else "fails ("
                             + ", ".join(f.text().split(": ", 1)[1]
                                         for f in reading.failures[arm]
                                         if f.setting == d.name) + ")")
                for arm in CONTENDERS) + ".", ""]
    out += arm_table(rows)
    return out


def arm_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every arm's row with a finished cell: n, val, test, paired differences, distinct
    share, costs."""
    out = ["| arm | from | n | val | test | val - random | test - random | val - best peer | "
           "test - best peer | distinct | " + " | ".join(c[1] for c in COST_COLUMNS) + " |",
           "|---" * (10 + len(COST_COLUMNS)) + "|"]
    for r in (r for r in rows if r["n"]):
        cells = [Interval(r["val"], r["val_half"], r["n"]).text(),
                 Interval(r["test"], r["test_half"], r["n"]).text()]
        for key in ("val_vs_random", "test_vs_random", "val_vs_peer", "test_vs_peer"):
            cells.append(Interval(r[key], r[f"{key}_half"], r[f"{key}_n"]).text(signed=True))
        distinct = "-" if math.isnan(r["distinct"]) else f"{r['distinct']:.2f}"
        costs = ["-" if r[key] is None else fmt.format(r[key]) for key, _, fmt in COST_COLUMNS]
        out.append(f"| {r['arm']} | {r['source']} | {r['n']} | " + " | ".join(cells)
                   + f" | {distinct} | " + " | ".join(costs) + " |")
    return [*out, ""]


def rule_section(found: Sequence[SettingData], reading: Reading) -> list[str]:
    """Steps 3-4 over the settings read, and what each new peer reached."""
    read_names = list(reading.best)
    out = ["## The rule", "",
           f"Settings read: {len(read_names)} of {len(found)}. Each contender's failures "
           "(paired val difference below fedowen-random or the best peer beyond the 95% "
           "interval) and its val averaged over the settings read.", ""]
    for arm in CONTENDERS:
        fails = [f.text() for f in reading.failures[arm]]
        mean = reading.means[arm]
        out.append(f"- {arm} (mean val {'-' if math.isinf(mean) else f'{mean:.2f}'}): "
                   + ("no failure" if not fails else "fails " + "; ".join(fails)))
    out.append("")
    if reading.adopted is None:
        out += [f"No default adopted: the rule waits for all {len(found)} settings.", ""]
    elif reading.fallback:
        out += [f"No contender is eligible; the fallback (fewest failing settings, then the "
                f"higher mean val) adopts **{reading.adopted}**, failing in "
                + "; ".join(f.text() for f in reading.failures[reading.adopted]) + ".", ""]
    else:
        out += [f"The rule adopts **{reading.adopted}** (eligible, the highest mean val).", ""]
    if read_names:
        out += peers_reached(found, reading)
    return out


def peers_reached(found: Sequence[SettingData], reading: Reading) -> list[str]:
    """Per setting read: each new peer tuned (mean val, paired val difference against
    fedowen-random), the best peer and, once a default is adopted, the default's mean val and
    paired val differences against fedowen-random and the best peer (where it falls short)."""
    adopted = reading.adopted
    head = ["setting", *NEW_PEERS, "best peer"]
    if adopted is not None:
        head += [f"{adopted} (adopted)", "- random", "- best peer"]
    out = [f"What each new peer reached (tuned, mean val; paired val difference against "
           f"{RANDOM})" + ("" if adopted is None else
                           f", beside the adopted default {adopted}") + ":", "",
           "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for d in (d for d in found if d.name in reading.best):
        s, best = d.setting, reading.best[d.name]
        cells = [d.name]
        for family in NEW_PEERS:
            arm = reading.tuned[d.name][family]
            cells.append(f"{arm} {s.mean(arm):.2f} ({s.diff(arm, RANDOM).text(signed=True)})")
        cells.append(f"{best} {s.mean(best):.2f}")
        if adopted is not None:
            cells += [f"{s.mean(adopted):.2f}", s.diff(adopted, RANDOM).text(signed=True),
                      s.diff(adopted, best).text(signed=True)]
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]


def loo_section(loo: Mapping[str, tuple[str, int]], seeds: int) -> list[str]:
    """Step 5: how many of the ``seeds`` leave-one-seed-out readings keep each decision."""
    if not loo:
        return ["## Leave one seed out", "", "Nothing decided yet.", ""]
    out = ["## Leave one seed out", "",
           "Each decision read again with each seed left out in turn (selection-dev's tuned "
           "best of Power-of-Choice and Oort kept as tuned there): how many of those "
           f"{seeds} readings keep it.", "", f"| decision | reading | kept (of {seeds}) |",
           "|---|---|---|"]
    out += [f"| {key} | {value} | {n} |" for key, (value, n) in loo.items()]
    return [*out, ""]
