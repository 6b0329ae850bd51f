"""What git tracks stays small and whole (issue 44): no file over 1 MB, docs/ under 25 MB,
per-round CSVs compressed, and every committed cell archive's parts there and as their manifest
says, holding every cell it lists."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

from sim.archives import MANIFEST, archive_sources
from sim.compact import DOCS_LIMIT, FILE_LIMIT, PART_LIMIT

ROOT = Path(__file__).resolve().parents[1]


def tracked_sizes() -> dict[str, int]:
    """Every tracked path with the size of its blob in the index (what a commit takes)."""
    staged = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-s", "-z"],
                            capture_output=True, text=True, check=True).stdout
    blobs = {}
    for entry in filter(None, staged.split("\0")):
        meta, path = entry.split("\t", 1)
        if meta.split()[0] != "160000":  # a submodule is a commit, not a blob
            blobs[path] = meta.split()[1]
    sizes = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch-check=%(objectsize)"],
                           input="\n".join(blobs.values()) + "\n", capture_output=True,
                           text=True, check=True).stdout.split()
    return dict(zip(blobs, map(int, sizes), strict=True))


def test_no_tracked_file_is_over_a_megabyte_and_docs_stay_under_their_budget() -> None:
    sizes = tracked_sizes()
    heavy = {path: size for path, size in sizes.items() if size > FILE_LIMIT}
    docs = sum(size for path, size in sizes.items() if path.startswith("docs/"))
    assert len(sizes) > 100  # it looked
    assert heavy == {}, (f"tracked files over {FILE_LIMIT} bytes: {heavy}; a cell archive goes "
                         "in parts (report --archive), a rounds CSV as .csv.gz, a plot through "
                         "sim.compact.save_png")
    assert docs <= DOCS_LIMIT, f"docs/ holds {docs} bytes of tracked files, over {DOCS_LIMIT}"


def test_reports_commit_their_per_round_csvs_compressed() -> None:
    plain = [p for p in tracked_sizes() if p.startswith("docs/results/")
             and p.endswith("-rounds.csv")]
    assert plain == [], f"write these as -rounds.csv.gz (sim.compact.open_csv): {plain}"


def test_every_committed_archive_part_is_there_as_its_manifest_says_with_its_cells() -> None:
    # Prepare: every report's manifest that names parts (the older ones name a store)
    manifests = [m for m in sorted((ROOT / "docs" / "results").glob(f"*/{MANIFEST}"))
                 if "parts" in json.loads(m.read_text())]
    tracked = set(tracked_sizes())
    checked = 0
    for manifest in manifests:
        meta = json.loads(manifest.read_text())
        # Execute: the parts, checked against their SHA-256
        parts = archive_sources(manifest)
        # Assert: tracked, under the part limit, and holding every listed cell in its part
        for part, listed in zip(parts, meta["parts"], strict=True):
            assert part.relative_to(ROOT).as_posix() in tracked, part
            assert part.stat().st_size <= PART_LIMIT
            with tarfile.open(part, "r:xz") as tar:
                cells = {m.name.partition("/")[0] for m in tar.getmembers()}
            k = meta["parts"].index(listed) + 1
            assert cells == {c["cell"] for c in meta["cells"] if c["part"] == k}, part
            checked += len(cells)
        assert all(c["part"] for c in meta["cells"]), manifest
    assert len(manifests) >= 8 and checked > 1000  # it looked


def test_the_readme_stays_a_short_user_guide() -> None:
    # Assert: under 200 lines (issue 44); the rest lives in docs/guide.md and docs/status.md
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move detail to docs/guide.md"
    assert "docs/architecture.md" in "\n".join(lines[:15])
