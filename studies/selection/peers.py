"""The selection-peers-dev grid's report (conf/selection-peers-dev.toml, issue 62 deliver 4).

Per setting of the grid, every arm read: this grid's (the anchor fedowen-random, the new peers
GreedyFed, DELTA and HiCS-FL with their knobs, the candidates hics-phi and delta-phi) and the
reference arms reused from selection-dev's committed records (fedowen, fedavg-equal, and the
best of Power-of-Choice and Oort as tuned there). The reuse holds in a setting only where this
grid's fedowen-random reproduces selection-dev's final validation and test accuracy exactly in
every seed (:func:`.peers_data.anchor_check`); where it does not, the report says the setting's
reference arms must run again here and does not compare it. Then the preset's rule
(:mod:`.peers_rule`): steps 1-4 on the complete settings, step 5 leave one seed out. A setting
with a missing cell decides nothing; its finished cells are still shown.

    python -m studies.selection.peers conf/selection-peers-dev.toml \\
        --results results/selection-peers-dev --reference-results docs/results/selection-dev \\
        --out docs/results/selection-peers-dev

``--reference-results`` takes selection-dev's results folder (``<cell>/rounds.jsonl``) or its
committed records: the report folder with ``cells-manifest.json``, a folder of
``cells-part*.tar.xz`` or one archive (read in place, nothing unpacked). Writes
``selection.md``, ``selection-arms.csv``, ``selection-seeds.csv``, ``selection-anchor.csv``,
``selection-<setting>-rounds.csv.gz`` and ``selection-<setting>-val.png``
(:mod:`.peers_report`), beside the grid's own report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studies.selection.peers_data import read_all
from studies.selection.peers_report import write


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path)
    p.add_argument("--results", type=Path, required=True, help="this grid's results folder")
    p.add_argument("--reference-results", type=Path, required=True,
                   help="selection-dev's results folder, or its committed records (its report "
                        "folder with cells-manifest.json, a folder of parts, an archive)")
    p.add_argument("--reference-preset", type=Path, default=Path("conf/selection-dev.toml"),
                   help="selection-dev's preset (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="where the report goes")
    args = p.parse_args(argv)
    preset, found, res, aside = read_all(args.preset, args.results, args.reference_results,
                                         args.reference_preset)
    command = " ".join(["python -m studies.selection.peers",
                        *(sys.argv[1:] if argv is None else argv)])
    for path in write(preset, found, res, args.out, command, aside):
        print(f"[selection-peers-dev] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
