"""The selection-peers-code reading, ``selection-code.md`` (:mod:`.peers_code` writes it): what
is missing, the anchor against selection-peers-dev, per setting the rule's steps 1-3 and every
arm's table, the adopted default against the best peer of either reading, leave one seed out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sim.results import LAST_K
from studies.selection.peers_code_rule import CODE_PEERS, CodeReading
from studies.selection.peers_markdown import (
    anchor_table,
    arm_table,
    loo_section,
    missing_section,
)
from studies.selection.peers_rule import CONTENDERS, RANDOM

if TYPE_CHECKING:
    from sim.grid import Preset
    from studies.selection.peers_code_data import CodeSetting


def markdown(preset: Preset, found: Sequence[CodeSetting], rows: Sequence[dict[str, Any]],
             reading: CodeReading, loo: Mapping[str, tuple[str, int]], seeds: int, done: int,
             total: int, command: str) -> str:
    """The whole page."""
    read_names = list(reading.best)
    state = "complete" if done == total else f"partial: {done} of {total} cells finished"
    out = [f"# {preset.name}: the rule's reading ({state})", "", preset.description, "",
           f"- Produced by: `{command}`.",
           f"- Cells of this grid finished: {done} of {total}; every other arm is read from "
           "selection-peers-dev's records (and the arms it reuses from selection-dev's), in "
           "settings where this grid's anchor reproduces.",
           "- Settings the rule reads (both grids' cells finished, both anchors holding): "
           + (", ".join(read_names) if read_names else "none yet") + ".", ""]
    if len(read_names) < len(found):
        out += ["A partial reading: a setting with a missing cell in either grid, or an anchor "
                "not reproduced, decides nothing (its finished cells are shown).", ""]
    out += [f"Accuracy (%): the mean of the last {LAST_K} rounds, over the seeds finished, ± "
            "the 95% t-interval's half-width; differences paired by seed; `val` decides, "
            "`test` is reported, never used. The best peer is of either reading (the papers' "
            "forms of selection-peers-dev, selection-dev's tuned best of Power-of-Choice and "
            "Oort, the code forms here).", ""]
    out += missing_section([c.data for c in found])[:-1]
    out += [f"- {c.data.name}: selection-peers-dev does not read it yet" for c in found
            if not c.earlier_read] + [""]
    stopped = [f"- {c.data.name}: {', '.join(c.stopped)}" for c in found if c.stopped]
    if stopped:
        out += ["## Cells the app stopped", "",
                "Stopped by the stall rule (no update accepted in `max-stalled-rounds` rounds "
                "in a row), scored at the model they stopped with (its accuracy carried to "
                "the last round, as the preset says):", "", *stopped, ""]
    out += anchor_section(found)
    for c in found:
        out += setting_section(c, [r for r in rows if r["setting"] == c.data.name], reading)
    out += rule_section(found, reading) + loo_section(loo, seeds)
    return "\n".join(out)


def anchor_section(found: Sequence[CodeSetting]) -> list[str]:
    """This grid's fedowen-random against selection-peers-dev's, seed by seed."""
    out = ["## The anchor", "",
           "fedowen-random here against selection-peers-dev's same cells: the final round's "
           "validation / test accuracy (%), equal in every seed or the setting's contenders "
           "run again here before it is read.", ""]
    out += [f"- {c.data.name}: {c.data.anchor.status}, "
            f"{sum(r['same'] is True for r in c.data.anchor.seeds)} of "
            f"{len(c.data.anchor.seeds)} seeds reproduced" for c in found]
    out += anchor_table([c.data for c in found], "selection-peers-dev")
    return [*out, ""]


def setting_section(c: CodeSetting, rows: Sequence[dict[str, Any]], reading: CodeReading
                    ) -> list[str]:
    """One setting: why it is not read (if so), steps 1-3, the arms' table."""
    d = c.data
    out = [f"## {d.name}", ""]
    if d.anchor.status == "differs":
        out += ["The anchor **differs** from selection-peers-dev (above): by the preset's rule "
                "this setting is reported, not read; only this grid's arms are shown.", ""]
    elif d.anchor.status == "copied":
        out += ["The anchor is **copied**: its cells here ran at selection-peers-dev's own "
                "commits (restored from that grid, not run again), so nothing here reproduces "
                "it; not read.", ""]
    elif d.name not in reading.best:
        out += [f"Not read yet: {len(d.missing)} cell(s) missing"
                + ("" if c.earlier_read else ", selection-peers-dev not read here") + ".", ""]
    else:
        s, best = d.setting, reading.best[d.name]
        out += ["Step 1, code forms tuned on val: " + "; ".join(
            f"{family} **{reading.tuned[d.name][family]}** ("
            + ", ".join(f"{a} {s.mean(a):.2f}" for a in arms) + ")"
            for family, arms in CODE_PEERS.items()) + ".", "",
            f"Step 2, best peer of either reading: **{best}** (val {s.mean(best):.2f}; "
            f"selection-peers-dev's: {reading.earlier.best[d.name]}).", "",
            "Step 3, paired val difference against it: " + "; ".join(
                f"{arm} {reading.vs_best[d.name][arm].text(signed=True)}"
                for arm in CONTENDERS) + ".", ""]
    return [*out, *arm_table(rows)]


def rule_section(found: Sequence[CodeSetting], reading: CodeReading) -> list[str]:
    """The adopted default against the best peer, and what each code form reached."""
    out = ["## The rule", ""]
    if reading.adopted is None:
        out += ["selection-peers-dev has adopted no default yet (it waits for all its "
                "settings): nothing to hold against the best peer.", ""]
    elif not reading.short():
        out += [f"The adopted default, **{reading.adopted}** (selection-peers-dev), is not below "
                "the best peer of either reading beyond the paired interval in any setting "
                "read.", ""]
    else:
        out += [f"The adopted default, **{reading.adopted}** (selection-peers-dev), falls short "
                "of the best peer of either reading in: " + "; ".join(
                    f"{name} {iv.text(signed=True)} vs {reading.best[name]}"
                    for name, iv in reading.short()) + ".", ""]
    if reading.best:
        out += ["What each code form reached (tuned, mean val; paired val difference against "
                "fedowen-random):", "",
                "| setting | " + " | ".join(CODE_PEERS) + " | best peer |",
                "|---" * (len(CODE_PEERS) + 2) + "|"]
        for c in (c for c in found if c.data.name in reading.best):
            s, tuned = c.data.setting, reading.tuned[c.data.name]
            cells = [f"{tuned[f]} {s.mean(tuned[f]):.2f} "
                     f"({s.diff(tuned[f], RANDOM).text(signed=True)})" for f in CODE_PEERS]
            out.append(f"| {c.data.name} | " + " | ".join(cells)
                       + f" | {reading.best[c.data.name]} |")
        out.append("")
    return out
