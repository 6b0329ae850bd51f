"""selection-peers-dev's cells as its report reads them (:mod:`.peers` is the command): this
grid's and selection-dev's clean cells by setting, arm and seed; the anchor check; each setting
with the reference arms it reuses, its missing cells and selection-dev's tuned best of
Power-of-Choice and Oort."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server_app.store.records import ROUNDS_FILE
from sim.archives import archived_files
from sim.cell_state import CODE_FILE
from sim.grid import Preset
from sim.presets import load_preset
from sim.results import CellResult, load_results
from studies.adversarial.attack_costs import attacked
from studies.selection.cells import TEST, VAL, cell_scores, distinct_share, setting_key, top_share
from studies.selection.development import PEERS, Setting
from studies.selection.peers_rule import RANDOM

#: Arms reused from selection-dev besides its tuned best of Power-of-Choice and Oort.
REFERENCE_ARMS = ("fedowen", "fedavg-equal")
#: selection-dev's tuned best of Power-of-Choice and Oort per setting, as the preset's header
#: states it; the report checks the records agree.
HEADER_BEST = {"mnist alpha=0.01": "poc-d50", "fashion-mnist alpha=0.01": "poc-d50",
               "mnist alpha=0.1": "poc-d20", "fashion-mnist alpha=0.1": "poc-d20",
               "femnist": "oort-x0.1", "cifar10 alpha=0.1": "oort-x0.3"}
#: Deviation 1 of the preset (the clients' step-scale fixed in 3b65123): the cells of the arms
#: that ask for it are read only if no attempt ran at a commit before the fix; the others are
#: set aside (read as missing, so they run again).
STEP_SCALE_ARMS = ("delta-s1", "delta-s0", "hics-t0.03", "hics-t0.1", "hics-phi")
BEFORE_FIX = ("c975d47",)
HERE, THERE = "here", "selection-dev"
#: ``{setting: {arm: {seed: CellResult}}}``
Cells = dict[str, dict[str, dict[int, CellResult]]]
#: Each cell's commits by cell id, here and in selection-dev (the anchor's cells share ids).
Commits = tuple[Mapping[str, list[str]], Mapping[str, list[str]]]


@dataclass(frozen=True)
class Anchor:
    """The anchor check of one setting: ``status`` is ``reproduced`` (every seed's final
    validation and test accuracy equal), ``differs`` (a seed finished in both that is not),
    ``pending`` (a seed not finished in both) or ``not needed`` (no arm reused); ``seeds``: one
    row per seed."""

    status: str
    seeds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return self.status in ("reproduced", "not needed")


@dataclass(frozen=True)
class SettingData:
    """One setting as read: the finished cells' scores (``setting``), every cell with records
    (curves and costs), where each arm comes from, selection-dev's tuned best of
    Power-of-Choice and Oort, the cells not finished, the anchor check, this grid's seeds and
    arms."""

    name: str
    setting: Setting
    results: dict[str, dict[int, CellResult]]
    sources: dict[str, str]
    reference_peer: str | None
    missing: list[str]
    anchor: Anchor
    seeds: tuple[int, ...]
    arms: tuple[str, ...]

    @property
    def decided(self) -> bool:
        """Whether the rule reads this setting: every cell finished and the anchor holds."""
        return not self.missing and self.anchor.holds and self.reference_peer is not None


def final_scores(result: CellResult | None) -> tuple[float, float] | None:
    """A finished cell's last round's (validation, test) accuracy as recorded; None while
    unfinished or without both."""
    if result is None or not result.finished:
        return None
    last = result.rounds[-1]
    if last.get(VAL) is None or last.get(TEST) is None:
        return None
    return float(last[VAL]), float(last[TEST])


def anchor_check(here: Mapping[int, CellResult], there: Mapping[int, CellResult],
                 seeds: tuple[int, ...], commits: Commits | None = None
                 ) -> Anchor:
    """fedowen-random's cells here against selection-dev's, seed by seed: reproduced only when
    every seed finished in both with exactly the same final validation and test accuracy."""
    rows, status = [], "reproduced"
    for seed in seeds:
        mine, theirs = final_scores(here.get(seed)), final_scores(there.get(seed))
        same = None if mine is None or theirs is None else mine == theirs
        rows.append({"seed": seed, "here": mine, "there": theirs, "same": same,
                     "commits_here": _commits_of(here.get(seed), commits and commits[0]),
                     "commits_there": _commits_of(there.get(seed), commits and commits[1])})
        if same is False:
            status = "differs"
        elif same is None and status == "reproduced":
            status = "pending"
    return Anchor(status, rows)


def _commits_of(result: CellResult | None, commits: Mapping[str, list[str]] | None) -> str:
    if result is None or commits is None:
        return ""
    return " ".join(c[:7] for c in commits.get(result.cell.cell_id, []))


def group(preset: Preset, res: Mapping[str, CellResult]) -> Cells:
    """Every clean cell of the preset (finished or not) by setting, arm and seed, in preset
    order."""
    out: Cells = {}
    for cell in preset.cells():
        if not attacked(cell.run_config):
            out.setdefault(setting_key(cell), {}).setdefault(
                cell.point["variant"], {})[cell.config.seed] = res[cell.cell_id]
    return out


def to_setting(name: str, arms: Mapping[str, Mapping[int, CellResult]], clients: int
               ) -> Setting:
    """The finished cells' scores, distinct and top shares."""
    s = Setting(name, {}, {}, {})
    for arm, by_seed in arms.items():
        for seed, result in sorted(by_seed.items()):
            if not result.finished:
                continue
            for metric, value in cell_scores(result).items():
                s.scores.setdefault(arm, {}).setdefault(metric, {})[seed] = value
            s.distinct.setdefault(arm, {})[seed] = distinct_share(result, clients)
            s.top.setdefault(arm, {})[seed] = top_share(result, clients)
    return s


def collect(local: Cells, remote: Cells, clients: int,
            commits: Commits | None = None) -> list[SettingData]:
    """Each setting of this grid (``local``) with the reference arms it does not run itself
    read from selection-dev (``remote``): fedowen, fedavg-equal and the best of
    Power-of-Choice and Oort as tuned there (on selection-dev's own cells, whichever arms run
    here), unless the anchor differs; a reference arm run again here is read from here."""
    out = []
    for name, arms in local.items():
        seeds = tuple(sorted({s for by_seed in arms.values() for s in by_seed}))
        theirs = remote.get(name, {})
        peer_arms = [a for family in PEERS.values() for a in family]
        tuning = [f"{THERE} {a} seed={s}" for a in peer_arms for s in seeds
                  if not scored(theirs.get(a, {}).get(s))]
        reference = None if tuning else to_setting(
            name, {a: theirs.get(a, {}) for a in peer_arms}, clients).best_peer()
        needed = (*REFERENCE_ARMS, *([reference] if reference else []))
        reused = [a for a in needed if a not in arms]
        anchor = (anchor_check(arms.get(RANDOM, {}), theirs.get(RANDOM, {}), seeds, commits)
                  if reused else Anchor("not needed"))
        source = {**dict.fromkeys(arms, HERE), **dict.fromkeys(reused, THERE)}
        cells = {a: (arms if source[a] == HERE else theirs).get(a, {}) for a in source}
        missing = [f"{'' if source[a] == HERE else THERE + ' '}{a} seed={s}"
                   for a in source for s in seeds if not scored(cells[a].get(s))] + tuning
        shown = [a for a in source if source[a] == HERE or anchor.status != "differs"]
        shown_cells = {a: {s: r for s, r in cells[a].items() if r.rounds} for a in shown}
        out.append(SettingData(name, to_setting(name, shown_cells, clients), shown_cells,
                               {a: source[a] for a in shown}, reference, missing, anchor,
                               seeds, tuple(arms)))
    return out


def scored(result: CellResult | None) -> bool:
    """Whether a cell is finished with a finite validation score (else the rule counts it as
    missing: a NaN would drop out of a mean or a pairing unseen)."""
    if result is None or not result.finished:
        return False
    return math.isfinite(cell_scores(result).get(VAL, math.nan))


def reference_results(preset: Preset, path: Path
                      ) -> tuple[dict[str, CellResult], dict[str, list[str]]]:
    """selection-dev's cells and each cell's commits, from its results folder or from its
    committed records (anything ``run --restore`` takes, read in place)."""
    cells = {c.cell_id: c for c in preset.cells()}
    if path.is_dir() and any((path / cid / ROUNDS_FILE).is_file() for cid in cells):
        return load_results(preset, path), local_commits(preset, path)
    rounds = {cid: [json.loads(line) for line in data.decode().splitlines() if line.strip()]
              for cid, data in archived_files(path, ROUNDS_FILE) if cid in cells}
    commits = {cid: _commit_list(data.decode())
               for cid, data in archived_files(path, CODE_FILE) if cid in cells}
    return {cid: CellResult(c, rounds.get(cid, [])) for cid, c in cells.items()}, commits


def local_commits(preset: Preset, results: Path) -> dict[str, list[str]]:
    """Each cell's commits from its ``code.json`` (the attempts that ran it)."""
    out = {}
    for cell in preset.cells():
        path = results / cell.cell_id / CODE_FILE
        if path.is_file():
            out[cell.cell_id] = _commit_list(path.read_text())
    return out


def _commit_list(text: str) -> list[str]:
    attempts = json.loads(text)
    return list(dict.fromkeys(a["commit"] for a in attempts if a.get("commit")))


def set_aside(res: Mapping[str, CellResult], commits: Mapping[str, list[str]]
              ) -> tuple[dict[str, CellResult], list[str]]:
    """``res`` with the cells deviation 1 sets aside emptied (an arm of
    :data:`STEP_SCALE_ARMS` with an attempt at a commit of :data:`BEFORE_FIX`), and their
    ids."""
    out, aside = dict(res), []
    for cid, result in res.items():
        if result.cell.point.get("variant") in STEP_SCALE_ARMS and any(
                c.startswith(BEFORE_FIX) for c in commits.get(cid, [])):
            out[cid] = CellResult(result.cell, [])
            aside.append(cid)
    return out, aside


def read_all(preset_path: Path, results: Path, reference: Path, reference_preset: Path
             ) -> tuple[Preset, list[SettingData], dict[str, CellResult], list[str]]:
    """The grid's settings as :func:`collect` reads them, this grid's cells (those set aside
    emptied) and the ids of the cells set aside."""
    preset, dev = load_preset(preset_path), load_preset(reference_preset)
    here = local_commits(preset, results)
    res, aside = set_aside(load_results(preset, results), here)
    dev_res, dev_commits = reference_results(dev, reference)
    return preset, collect(group(preset, res), group(dev, dev_res), preset.num_supernodes,
                           (here, dev_commits)), res, aside
