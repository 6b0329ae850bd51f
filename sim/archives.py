"""Cell archives: every finished cell's records, kept in git in parts (issues 30 and 44).

``report --archive`` (:func:`keep_archive`) writes three things:

- beside the report, ``cells-records.tar.gz`` (:data:`sim.carry.RECORDS`: every finished
  cell's config and code record, a few kB), from which cells carried back from the report's
  rows (``run --carry``) get their records;
- the full archive (:data:`ARCHIVED`: every finished cell's ``rounds.jsonl``, summary, config,
  code record and carried rows) as ``cells-partNN.tar.xz``, each a tar of whole cells and at
  most :data:`sim.compact.PART_LIMIT` bytes, so no tracked file is over 1 MB; the cells its
  parts already held come first, in their order (:func:`kept_first`), so archiving a sweep
  again rewrites only its last part and adds new ones. xz, not gzip:
  one part holds a few MB of JSON lines and xz's larger window makes it about 30% smaller. The
  parts of a report under ``docs/results/<preset>`` go to ``archives/<preset>/`` at the
  repository's root (docs/ stays small enough to read and to send); elsewhere they lie beside
  the report;
- beside the report, ``cells-manifest.json`` (:data:`MANIFEST`): every part with its SHA-256,
  every cell with its part and the commits it ran at, and how to rebuild the cells.

``run --restore`` (:func:`restore_cells`, repeatable) takes a manifest, a folder of parts (or
of a report with a manifest), any one tar archive (``.tar.gz`` or ``.tar.xz``), or a report's
``cells.tar.gz`` that has since become a manifest beside it (so older commands still work).

Until issue 44 an archive over 1 MB left git for the archive store (:func:`archive_store`, one
machine's disk) and its manifest named it there; such a manifest still restores from the store
when the archive is there, and says how to rebuild the cells when it is not.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sim.carry import RECORDED, RECORDS
from sim.cell_state import CODE_FILE, SUMMARY_FILE
from sim.compact import PART_LIMIT
from sim.grid import Preset
from sim.results import CARRIED_FILE

#: One archive of every finished cell (``archive_cells``): what a device call returns and what a
#: report kept beside itself before issue 44.
ARCHIVE = "cells.tar.gz"
ARCHIVED = ("rounds.jsonl", SUMMARY_FILE, "config.json", CODE_FILE, CARRIED_FILE)
MANIFEST = "cells-manifest.json"
PART = "cells-part{:02d}.tar.xz"
_PART_NAME = re.compile(r"cells-part(\d+)\.tar\.xz")
#: The repository: a report under its ``docs/results/`` keeps its parts under ``archives/``.
REPO = Path(__file__).resolve().parents[1]

Entry = tuple[tarfile.TarInfo, bytes]


def archive_store() -> Path:
    """Where archives too large for git were kept before issue 44: ``$FEDOWEN_ARCHIVES``, else
    ``~/.cache/fedowen/archives``."""
    return Path(os.environ.get("FEDOWEN_ARCHIVES") or Path.home() / ".cache" / "fedowen"
                / "archives")


def parts_folder(out: Path) -> Path:
    """Where the parts of the report in ``out`` go: ``archives/<preset>`` for a report under
    ``docs/results/<preset>``, else ``out`` itself."""
    out = out.resolve()
    docs = REPO / "docs" / "results"
    return REPO / "archives" / out.relative_to(docs) if out.is_relative_to(docs) else out


def cell_entries(preset: Preset, results: Path, names: tuple[str, ...] = ARCHIVED
                 ) -> list[list[Entry]]:
    """Every finished cell's files of ``names``, in the preset's order, as tar entries with no
    time, owner or mode of this machine (the same cells give the same entries)."""
    cells = []
    for cell in preset.cells():
        cell_dir = results / cell.cell_id
        if not (cell_dir / SUMMARY_FILE).exists():
            continue
        entries = []
        for name in names:
            if (cell_dir / name).exists():
                data = (cell_dir / name).read_bytes()
                info = tarfile.TarInfo(f"{cell.cell_id}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                entries.append((info, data))
        cells.append(entries)
    return cells


def archive_cells(preset: Preset, results: Path, path: Path,
                  names: tuple[str, ...] = ARCHIVED) -> Path:
    """Write ``path``, one ``.tar.gz`` of every finished cell's files of ``names``
    (``<cell id>/rounds.jsonl``, summary, config and code record by default), so another
    machine can restore them (``run --restore``) and go on. The same cells give the same
    bytes."""
    with path.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for entries in cell_entries(preset, results, names):
            for info, data in entries:
                tar.addfile(info, io.BytesIO(data))
    return path


def pack(cells: list[list[Entry]]) -> bytes:
    """One ``.tar.xz`` of the cells' entries (the same entries give the same bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=6) as tar:
        for entries in cells:
            for info, data in entries:
                tar.addfile(copy.copy(info), io.BytesIO(data))
    return buf.getvalue()


def write_parts(cells: list[list[Entry]], folder: Path, limit: int | None = None
                ) -> list[Path]:
    """Write the cells as ``folder/cells-partNN.tar.xz``, whole cells in order, each part at
    most ``limit`` bytes (default :data:`~sim.compact.PART_LIMIT`; earlier parts there are
    removed first); returns the parts.

    A part takes cells up to a raw size that a compression ratio says will fit (the previous
    part's), takes more once when it came out under 85% of ``limit`` and gives back cells
    when it is over: most parts come out at 85-97% of ``limit``.
    """
    limit = PART_LIMIT if limit is None else limit
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("cells-part*.tar.xz"):
        old.unlink()
    raw = [sum(512 + len(data) for _, data in entries) for entries in cells]

    def fill(start: int, ratio: float) -> int:
        end, size = start, 0
        while end < len(cells) and (end == start or size + raw[end] <= 0.97 * limit / ratio):
            size, end = size + raw[end], end + 1
        return end

    packed: list[bytes] = []
    start, ratio = 0, 0.25
    while start < len(cells):
        end = fill(start, ratio)
        data = pack(cells[start:end])
        if end < len(cells) and len(data) < 0.85 * limit:
            end = fill(start, len(data) / sum(raw[start:end]))
            data = pack(cells[start:end])
        while len(data) > limit:
            if end - start == 1:
                raise ValueError(f"{cells[start][0][0].name.partition('/')[0]}: one cell is "
                                 f"{len(data)} bytes compressed, over the part limit {limit}")
            end = start + max(1, int((end - start) * 0.97 * limit / len(data)))
            data = pack(cells[start:end])
        ratio = len(data) / sum(raw[start:end])
        packed.append(data)
        start = end
    paths = [folder / PART.format(k) for k in range(1, len(packed) + 1)]
    for path, data in zip(paths, packed, strict=True):
        path.write_bytes(data)
    return paths


def kept_first(cells: list[list[Entry]], folder: Path) -> list[list[Entry]]:
    """The cells with those the parts in ``folder`` already hold first, in the parts' order,
    then the rest as given: an archive of more cells rewrites only the last part it had and
    adds parts, so git keeps one copy of the earlier ones (a sweep that finishes cells out of
    the preset's order, seed by seed, would otherwise reshuffle every part each time)."""
    held: dict[str, int] = {}
    for part in sorted(folder.glob("cells-part*.tar.xz"), key=_part_number):
        with tarfile.open(part, "r:xz") as tar:
            for m in tar.getmembers():
                held.setdefault(m.name.partition("/")[0], len(held))
    old = sorted((c for c in cells if _cell_of(c) in held), key=lambda c: held[_cell_of(c)])
    return old + [c for c in cells if _cell_of(c) not in held]


def _cell_of(entries: list[Entry]) -> str:
    return entries[0][0].name.partition("/")[0]


def write_manifest(out: Path, preset: str, parts: list[Path], cells: list[dict[str, Any]],
                   rebuild: str, **extra: Any) -> Path:
    """``out/cells-manifest.json``: the parts (path from ``out``, SHA-256, bytes, cells), each
    cell's entry of ``cells`` with the part that holds it, the rebuild command; ``extra``
    keys as given."""
    part_of: dict[str, int] = {}
    listed = []
    for k, part in enumerate(parts, 1):
        with tarfile.open(part, "r:xz") as tar:
            ids = list(dict.fromkeys(m.name.partition("/")[0] for m in tar.getmembers()))
        part_of |= dict.fromkeys(ids, k)
        data = part.read_bytes()
        listed.append({"file": Path(os.path.relpath(part, out)).as_posix(),
                       "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                       "cells": len(ids)})
    manifest = {"preset": preset, "parts": listed,
                "cells": [{**c, "part": part_of.get(c["cell"])} for c in cells],
                "rebuild": rebuild, **extra}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out / MANIFEST


def keep_archive(preset: Preset, results: Path, out: Path, source: str | None = None,
                 folder: Path | None = None) -> Path:
    """The report's archive: ``out/cells-records.tar.gz``, the parts in ``folder`` (default
    :func:`parts_folder`) and ``out/cells-manifest.json``, which is returned; a
    ``cells.tar.gz`` of an older report in ``out`` is removed (the parts hold its cells).
    ``source``: the preset file, for the manifest's rebuild command (default
    ``conf/<preset name>.toml``)."""
    archive_cells(preset, results, out / RECORDS, names=RECORDED)
    folder = folder or parts_folder(out)
    parts = write_parts(kept_first(cell_entries(preset, results), folder), folder)
    (out / ARCHIVE).unlink(missing_ok=True)
    cells = []
    for cell in preset.cells():
        code = results / cell.cell_id / CODE_FILE
        if (results / cell.cell_id / SUMMARY_FILE).exists():
            attempts = json.loads(code.read_text()) if code.exists() else []
            cells.append({"cell": cell.cell_id, "grid": cell.grid, "point": cell.point,
                          "commits": sorted({a["commit"] for a in attempts if a.get("commit")})})
    rebuild = (f"python -m sim.experiments run {source or f'conf/{preset.name}.toml'}, each "
               "cell at the commit it lists (runs are bit-identical at a commit on one kind of "
               "CPU)")
    return write_manifest(out, preset.name, parts, cells, rebuild)


def archive_sources(path: Path) -> list[Path]:
    """The tar files that ``run --restore PATH`` unpacks: a manifest's parts (each checked
    against its SHA-256) or its stored archive (a manifest from before issue 44); a folder's
    manifest, else its parts, else its ``cells.tar.gz``; a ``cells.tar.gz`` that is gone from
    a report with a manifest: that manifest's; any other file as it is.

    Raises
    ------
    SystemExit
        When nothing is there, or a part or stored archive is missing or differs: saying what
        and how to rebuild the cells.
    """
    if path.is_dir():
        if (path / MANIFEST).is_file():
            return archive_sources(path / MANIFEST)
        parts = sorted(path.glob("cells-part*.tar.xz"), key=_part_number)
        if parts or (path / ARCHIVE).is_file():
            return parts or [path / ARCHIVE]
        raise SystemExit(f"--restore {path}: a folder with no {MANIFEST}, cells-part*.tar.xz "
                         f"or {ARCHIVE}")
    if not path.is_file():
        if path.name == ARCHIVE and (path.parent / MANIFEST).is_file():
            return archive_sources(path.parent / MANIFEST)
        raise SystemExit(f"--restore {path}: no such file (a report's {MANIFEST}, its folder, "
                         "a folder of parts or one archive)")
    if path.name != MANIFEST:
        return [path]
    meta = json.loads(path.read_text())
    if "parts" not in meta:
        return [stored_archive(path)]
    found = []
    for part in meta["parts"]:
        file = (path.parent / part["file"]).resolve()
        if not file.is_file() or hashlib.sha256(file.read_bytes()).hexdigest() != part["sha256"]:
            raise SystemExit(f"--restore {path}: its part {part['file']} (sha256 "
                             f"{part['sha256'][:12]}...) is missing or differs: check it out "
                             f"again from git, or rebuild the cells: {meta['rebuild']}")
        found.append(file)
    return found


def _part_number(path: Path) -> int:
    found = _PART_NAME.fullmatch(path.name)
    return int(found[1]) if found else 0


def stored_archive(manifest: Path) -> Path:
    """The archive a manifest from before issue 44 names, from :func:`archive_store`, checked
    against its SHA-256.

    Raises
    ------
    SystemExit
        When it is not there (or differs), saying where to put it or how to rebuild the cells.
    """
    meta = json.loads(manifest.read_text())
    path = archive_store() / meta["archive"]
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != meta["sha256"]:
        raise SystemExit(f"--restore {manifest}: its archive {meta['archive']} (sha256 "
                         f"{meta['sha256'][:12]}...) is not in {archive_store()}: copy it "
                         f"there (FEDOWEN_ARCHIVES sets the folder), or rebuild the cells: "
                         f"{meta['rebuild']}")
    return path


def archived_files(path: Path, name: str) -> Iterator[tuple[str, bytes]]:
    """``(cell id, bytes)`` of every cell's file ``name`` in what ``run --restore PATH``
    would unpack (:func:`archive_sources`)."""
    for source in archive_sources(path):
        with tarfile.open(source, "r:*") as tar:
            for member in tar:
                cell, _, file = member.name.partition("/")
                handle = tar.extractfile(member) if file == name else None
                if handle is not None:
                    yield cell, handle.read()


def restore_cells(archive: Path, results: Path) -> int:
    """Unpack the finished cells of ``archive`` (anything :func:`archive_sources` takes) into
    ``results`` without overwriting a cell that is already there; returns how many cells
    were restored."""
    restored: set[str] = set()
    for source in archive_sources(archive):
        with tarfile.open(source, "r:*") as tar:
            for member in tar.getmembers():
                cell, _, name = member.name.partition("/")
                if not member.isfile() or name not in ARCHIVED or "/" in name or ".." in cell:
                    continue
                if (results / cell / SUMMARY_FILE).exists() and cell not in restored:
                    continue
                tar.extract(member, results, filter="data")
                restored.add(cell)
    return len(restored)
