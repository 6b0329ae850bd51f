"""Cell archives in parts (sim.archives): whole cells in order, every part under the limit, the
same cells giving the same bytes."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from sim.archives import Entry, archive_sources, kept_first, write_parts


def cells(n: int, rounds: int, seed: int = 0) -> list[list[Entry]]:
    """``n`` cells, each a rounds.jsonl of ``rounds`` records with the digits of real runs."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        lines = [json.dumps({"round": r, "test_accuracy": float(rng.random()),
                             "weights": {str(i): float(w) for i, w in enumerate(rng.random(10))}})
                 for r in range(rounds)]
        data = ("\n".join(lines) + "\n").encode()
        info = tarfile.TarInfo(f"cell{k:03d}/rounds.jsonl")
        info.size = len(data)
        out.append([(info, data)])
    return out


def members(parts: list[Path]) -> list[list[str]]:
    found = []
    for part in parts:
        with tarfile.open(part, "r:xz") as tar:
            found.append([m.name for m in tar.getmembers()])
    return found


def test_parts_hold_whole_cells_in_order_each_under_the_limit(tmp_path: Path) -> None:
    # Prepare: 60 cells of about 4 kB compressed each, parts of at most 30 kB
    data = cells(60, 40)
    limit = 30_000
    # Execute
    parts = write_parts(data, tmp_path / "a", limit=limit)
    again = write_parts(data, tmp_path / "b", limit=limit)
    # Assert: every cell once, in order, whole; no part over the limit, all but the last at
    # least 85% full; the same bytes twice; a folder restores them in order
    names = members(parts)
    assert [n for part in names for n in part] == [c[0][0].name for c in data]
    sizes = [p.stat().st_size for p in parts]
    assert max(sizes) <= limit and min(sizes[:-1]) >= 0.85 * limit and len(parts) >= 5
    assert [p.read_bytes() for p in parts] == [p.read_bytes() for p in again]
    assert archive_sources(tmp_path / "a") == parts
    # and writing fewer cells leaves no stale part behind
    assert write_parts(data[:2], tmp_path / "a", limit=limit) == [tmp_path / "a" /
                                                                   "cells-part01.tar.xz"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["cells-part01.tar.xz"]


def test_a_cell_larger_than_a_part_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cell000: one cell is \d+ bytes compressed, over the "
                                         r"part limit 2000"):
        write_parts(cells(1, 40), tmp_path, limit=2000)


def test_archiving_more_cells_keeps_every_part_but_the_last_byte_for_byte(tmp_path: Path
                                                                          ) -> None:
    # Prepare: 30 of 60 cells archived, every other one (a sweep finishing seed by seed)
    data = cells(60, 40)
    limit = 30_000
    first = write_parts(kept_first(data[::2], tmp_path), tmp_path, limit=limit)
    before = [p.read_bytes() for p in first]
    # Execute: all 60 in the preset's order
    ordered = kept_first(data, tmp_path)
    after = write_parts(ordered, tmp_path, limit=limit)
    # Assert: the archived cells first in their order, then the rest; every earlier part but
    # the last the same bytes, and every cell once
    names = [c[0][0].name for c in ordered]
    assert names[:30] == [c[0][0].name for c in data[::2]]
    assert names[30:] == [c[0][0].name for c in data[1::2]]
    assert len(first) >= 3 and len(after) > len(first)
    assert [p.read_bytes() for p in after[:len(first) - 1]] == before[:-1]
    assert sorted(n for part in members(after) for n in part) == sorted(
        c[0][0].name for c in data)
