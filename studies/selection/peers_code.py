"""The selection-peers-code grid's reading (conf/selection-peers-code.toml, issue 62's follow-up).

DELTA as its public code runs it and HiCS-FL with its code's clustered-sampling switch, beside
selection-peers-dev's reading.

selection-peers-dev is read as :mod:`.peers` reads it (its records, with selection-dev's it
reuses, from results folders or committed archives); this grid's arms join each of its
settings whose anchor reproduces: this grid's fedowen-random against selection-peers-dev's,
the final round's validation and test accuracy equal in every seed. A setting is read when
every cell of both grids is finished and both anchors hold; then the preset's rule
(:mod:`.peers_code_rule`).

    python -m studies.selection.peers_code conf/selection-peers-code.toml \\
        --results results/selection-peers-code \\
        --earlier-results archives/selection-peers-dev \\
        --reference-results docs/results/selection-dev --out docs/results/selection-peers-code

Writes ``selection-code.md``, ``selection-code-arms.csv``, ``selection-code-seeds.csv``,
``selection-code-anchor.csv``, ``selection-code-decisions.json`` and per setting with cells of
this grid ``selection-code-<setting>-rounds.csv.gz`` (this grid's cells, every round) and
``selection-code-<setting>-val.png``, beside the grid's own report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from sim.grid import Preset
from sim.results import CellResult
from studies.selection.cells import write_csv
from studies.selection.peers_code_data import CodeSetting, read_all
from studies.selection.peers_code_page import markdown
from studies.selection.peers_code_rule import (
    CodeReading,
    kept_code,
    leave_one_out_code,
    read_code,
)
from studies.selection.peers_data import HERE
from studies.selection.peers_report import (
    anchor_rows,
    arm_rows,
    plot,
    seed_rows,
    slug,
    write_rounds,
)


def write(preset: Preset, found: Sequence[CodeSetting], res: Mapping[str, CellResult],
          out: Path, command: str) -> list[Path]:
    """Apply the rule to the settings read and write the reading's files into ``out``."""
    decided = [c.data for c in found if c.decided]
    earlier = [c.earlier for c in found if c.earlier_read]
    reference = {d.name: d.reference_peer or "" for d in earlier}
    reading = read_code([d.setting for d in decided], reference, len(found),
                        [d.setting for d in earlier])
    seeds = sorted({s for d in earlier for s in d.seeds})
    loo = kept_code(reading, leave_one_out_code([d.setting for d in decided], reference, seeds,
                                                len(found), [d.setting for d in earlier]))
    done = sum(r.finished for r in res.values())
    rows = arm_rows([c.data for c in found], replace(reading.earlier, best=reading.best))
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"selection-code{suffix}" for suffix in
             (".md", "-arms.csv", "-seeds.csv", "-anchor.csv", "-decisions.json")]
    paths[0].write_text(markdown(preset, found, rows, reading, loo, len(seeds), done,
                                 len(res), command))
    write_csv(paths[1], rows)
    write_csv(paths[2], seed_rows([c.data for c in found]))
    write_csv(paths[3], anchor_rows([c.data for c in found], "selection_peers_dev"))
    paths[4].write_text(json.dumps(decisions_data(found, reading, loo, len(seeds)), indent=1)
                        + "\n")
    for c in found:
        if c.own:
            own = replace(c.data, results=c.own, sources=dict.fromkeys(c.own, HERE))
            paths.append(write_rounds(own, out / f"selection-code-{slug(c.data.name)}"
                                               "-rounds.csv.gz"))
            paths.append(plot(c.data, out / f"selection-code-{slug(c.data.name)}-val.png",
                              preset.name))
    return paths


def decisions_data(found: Sequence[CodeSetting], reading: CodeReading,
                   loo: Mapping[str, tuple[str, int]], seeds: int) -> dict[str, object]:
    """The reading as data: per setting read the code-form peers tuned, the best peer of either
    reading and its source, each contender's paired val difference against it; the adopted
    default and where it falls short; each decision's leave-one-out count."""
    sources = {c.data.name: c.data.sources for c in found}
    return {
        "settings_read": list(reading.best), "settings_total": len(found),
        "settings": {name: {"tuned": reading.tuned[name], "best_peer": best,
                            "best_peer_from": sources[name].get(best, ""),
                            "earlier_best_peer": reading.earlier.best[name],
                            "vs_best_peer": {a: [iv.mean, iv.half, iv.n]
                                             for a, iv in reading.vs_best[name].items()}}
                     for name, best in reading.best.items()},
        "adopted": reading.adopted,
        "adopted_short": [[name, iv.mean, iv.half] for name, iv in reading.short()],
        "kept": {k: {"decision": v, "kept": n, "of": seeds} for k, (v, n) in loo.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path)
    p.add_argument("--results", type=Path, required=True,
                   help="this grid's results folder or its committed records")
    p.add_argument("--earlier-results", type=Path, required=True,
                   help="selection-peers-dev's results folder or committed records")
    p.add_argument("--earlier-preset", type=Path, default=Path("conf/selection-peers-dev.toml"),
                   help="selection-peers-dev's preset (default: %(default)s)")
    p.add_argument("--reference-results", type=Path, required=True,
                   help="selection-dev's results folder or committed records")
    p.add_argument("--reference-preset", type=Path, default=Path("conf/selection-dev.toml"),
                   help="selection-dev's preset (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="where the reading goes")
    args = p.parse_args(argv)
    preset, found, res = read_all(args.preset, args.results, args.earlier_preset,
                                  args.earlier_results, args.reference_preset,
                                  args.reference_results)
    command = " ".join(["python -m studies.selection.peers_code",
                        *(sys.argv[1:] if argv is None else argv)])
    for path in write(preset, found, res, args.out, command):
        print(f"[selection-peers-code] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
