"""selection-peers-code's cells as its reading reads them (:mod:`.peers_code` is the command):
selection-peers-dev's settings as :mod:`.peers_data` reads them, with this grid's arms joined
where this grid's fedowen-random reproduces selection-peers-dev's.

Two rules of the preset's header live here: a cell of this grid the app stopped by its stall
rule (no update accepted in ``max-stalled-rounds`` rounds in a row) is scored at the model it
stopped with (:func:`carried`), and an anchor seed whose commits are selection-peers-dev's
own is a copy of its cell, not a reproduction (status ``copied``: the setting is not read)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from server_app.stall import stall_reason
from server_app.store.records import ROUNDS_FILE
from sim.archives import ARCHIVE, MANIFEST
from sim.grid import Preset
from sim.presets import load_preset
from sim.results import CellResult
from studies.selection.cells import TEST, VAL
from studies.selection.peers_data import (
    HERE,
    THERE,
    Anchor,
    Commits,
    SettingData,
    anchor_check,
    collect,
    group,
    reference_results,
    scored,
    set_aside,
    to_setting,
)
from studies.selection.peers_rule import RANDOM

#: Where the arms of selection-peers-dev's own cells come from, in this reading's tables.
EARLIER = "selection-peers-dev"


@dataclass(frozen=True)
class CodeSetting:
    """One setting: selection-peers-dev's arms with this grid's (``data``: its anchor this
    grid's, its missing cells both grids'), the setting as selection-peers-dev reads it alone
    (``earlier``: its reading and adopted default are made on these) and this grid's own cells
    with records (``own``: its per-round files); ``stopped``: this grid's cells the app stopped,
    scored at the model they stopped with (``arm seed=N at round R``)."""

    data: SettingData
    earlier: SettingData
    own: dict[str, dict[int, CellResult]]
    stopped: tuple[str, ...] = ()

    @property
    def earlier_read(self) -> bool:
        """Whether selection-peers-dev reads this setting."""
        return self.earlier.decided

    @property
    def decided(self) -> bool:
        return self.earlier_read and self.data.decided


def merge(d: SettingData, mine: Mapping[str, Mapping[int, CellResult]], clients: int,
          commits: Commits | None = None) -> CodeSetting:
    """``d``, one setting of selection-peers-dev as :func:`.peers_data.collect` reads it, with
    this grid's arms ``mine``; where the anchor differs only this grid's arms are shown. A
    missing cell of selection-peers-dev's is named with its grid (this grid's are not)."""
    stopped = tuple(f"{a} seed={seed} at round {r.rounds[-1].get('round')}"
                    for a, by_seed in mine.items() for seed, r in sorted(by_seed.items())
                    if carried(r) is not r)
    scored_here = {a: {seed: carried(r) for seed, r in by_seed.items()}
                   for a, by_seed in mine.items()}
    anchor = copied(anchor_check(scored_here.get(RANDOM, {}), d.results.get(RANDOM, {}),
                                 d.seeds, commits))
    new = [a for a in mine if a != RANDOM]
    missing = [*(m if m.startswith(f"{THERE} ") else f"{EARLIER} {m}" for m in d.missing),
               *(f"{a} seed={s}" for a in mine for s in d.seeds
                 if not scored(scored_here[a].get(s)))]
    arms: dict[str, Mapping[int, CellResult]]
    if anchor.status == "differs":
        arms, sources = dict(scored_here), dict.fromkeys(mine, HERE)
    else:
        arms = {**d.results, **{a: scored_here[a] for a in new}}
        sources = {**{a: EARLIER if src == HERE else src for a, src in d.sources.items()},
                   **dict.fromkeys(new, HERE)}
    shown = {a: {s: r for s, r in by_seed.items() if r.rounds} for a, by_seed in arms.items()}
    own = {a: ran for a, by_seed in mine.items()
           if (ran := {s: r for s, r in by_seed.items() if r.rounds})}
    data = SettingData(d.name, to_setting(d.name, shown, clients), shown, sources,
                       d.reference_peer, missing, anchor, d.seeds, tuple(mine))
    return CodeSetting(data, d, own, stopped)


def carried(result: CellResult) -> CellResult:
    """``result``, or, for a cell the app stopped by its stall rule (its records meet
    :func:`server_app.stall.stall_reason` before the last round), the cell carried to its last
    round at the model it stopped with: the last record's accuracies in every round after it
    (``carried``: true), so its score is that model's, as if every later round had accepted
    nothing as well. A cell still running does not meet the rule (the app stops at once)."""
    if result.finished or not result.rounds:
        return result
    training = [r for r in result.rounds if r.get("round", 0) > 0]
    if stall_reason(training, result.cell.config.max_stalled_rounds) is None:
        return result
    last = result.rounds[-1]
    after = [{"round": r, VAL: last.get(VAL), TEST: last.get(TEST), "carried": True}
             for r in range(int(last.get("round", 0)) + 1, result.total_rounds + 1)]
    return CellResult(result.cell, [*result.rounds, *after])


def copied(anchor: Anchor) -> Anchor:
    """``anchor`` as ``copied`` when a seed's cell here ran at exactly selection-peers-dev's
    commits (its cell restored from that grid, not run again: the same ids); else as is."""
    if any(r["commits_here"] and r["commits_here"] == r["commits_there"]
           for r in anchor.seeds):
        return Anchor("copied", anchor.seeds)
    return anchor


def read_all(preset_path: Path, results: Path, earlier_path: Path, earlier_results: Path,
             reference_path: Path, reference_results_path: Path
             ) -> tuple[Preset, list[CodeSetting], dict[str, CellResult]]:
    """Every setting of selection-peers-dev with this grid's arms, and this grid's cells."""
    preset = load_preset(preset_path)
    check_results(preset, preset_path, results)
    for flag, path in (("--earlier-results", earlier_results),
                       ("--reference-results", reference_results_path)):
        if not path.exists():
            raise SystemExit(f"{flag} {path}: no such folder or archive (a results folder, a "
                             "report folder with cells-manifest.json, a folder of parts or "
                             "one archive)")
    earlier, dev = load_preset(earlier_path), load_preset(reference_path)
    e_res, e_commits = reference_results(earlier, earlier_results)
    e_res, _ = set_aside(e_res, e_commits)
    d_res, d_commits = reference_results(dev, reference_results_path)
    found = collect(group(earlier, e_res), group(dev, d_res), earlier.num_supernodes,
                    (e_commits, d_commits))
    res, commits = reference_results(preset, results)
    mine = group(preset, res)
    return preset, [merge(d, mine.get(d.name, {}), preset.num_supernodes, (commits, e_commits))
                    for d in found], res


def check_results(preset: Preset, preset_path: Path, results: Path) -> None:
    """Stop, saying what to do, when ``results`` holds neither a round of this grid's cells
    nor committed records (before the earlier grids' records are read)."""
    run = f"run the grid first (python -m sim.experiments run {preset_path})"
    if not results.exists():
        raise SystemExit(f"--results {results}: no such folder or archive; {run}")
    if results.is_dir() and not (
            any((results / c.cell_id / ROUNDS_FILE).is_file() for c in preset.cells())
            or (results / MANIFEST).is_file() or (results / ARCHIVE).is_file()
            or any(results.glob("cells-part*.tar.xz"))):
        raise SystemExit(f"--results {results}: no cell of {preset.name} has recorded a round "
                         f"there yet and it holds no committed records; {run}, or pass its "
                         "report folder (cells-manifest.json)")
