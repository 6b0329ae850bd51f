"""Report files kept small for git (issue 44): per-round CSVs gzip-compressed with fixed bytes,
PNG plots on a 256-colour palette, and the size limits every tracked file keeps to.

No tracked file is over :data:`FILE_LIMIT` and ``docs/`` stays under :data:`DOCS_LIMIT`
(``tests/test_committed_files.py``); a cell archive is written in parts of at most
:data:`PART_LIMIT` (:mod:`sim.archives`). A per-round CSV (``<grid>-rounds.csv.gz``) is
compressed 5-10 times: its numbers have two to four decimals. A plot keeps its pixels and
resolution but stores them as a palette of 256 colours (the curves and bands of a report use a
few dozen), 3-4 times smaller than matplotlib's RGBA.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The largest file git tracks (bytes).
FILE_LIMIT = 1_000_000
#: The largest part of a cell archive (bytes): under :data:`FILE_LIMIT` with room to spare.
PART_LIMIT = 950_000
#: What all of ``docs/`` may weigh (bytes, tracked files).
DOCS_LIMIT = 25_000_000
#: A grid's per-round CSV beside its report: ``<grid>-rounds.csv.gz``.
ROUNDS_SUFFIX = "-rounds.csv.gz"


@contextmanager
def open_csv(path: Path, mode: str = "r") -> Iterator[IO[str]]:
    """A CSV file's text, for ``csv.reader``/``csv.writer`` (``mode`` ``"r"`` or ``"w"``);
    gzip-compressed when ``path`` ends in ``.gz``.

    Written compressed, the same rows give the same bytes (no name or time in the gzip
    header), and the plain file of the same name without ``.gz`` is removed, so a rewritten
    report keeps one copy of its rows.
    """
    if mode not in ("r", "w"):
        raise ValueError(f"open_csv mode {mode!r}: use 'r' or 'w'")
    if path.suffix != ".gz":
        with path.open(mode, newline="", encoding="utf-8") as fh:
            yield fh
        return
    if mode == "r":
        with gzip.open(path, "rt", newline="", encoding="utf-8") as fh:
            yield fh
        return
    with path.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8", newline="") as fh:
        yield fh
    path.with_suffix("").unlink(missing_ok=True)


def rounds_file(report_dir: Path, grid: str) -> Path | None:
    """A report's per-round CSV of ``grid``: ``<grid>-rounds.csv.gz``, or a plain
    ``<grid>-rounds.csv`` written before the CSVs were compressed; None when neither is there.

    Raises
    ------
    SystemExit
        When both are there: which one holds the rows is not for a reader to guess.
    """
    packed = report_dir / f"{grid}{ROUNDS_SUFFIX}"
    plain = packed.with_suffix("")
    if packed.is_file() and plain.is_file():
        raise SystemExit(f"{report_dir}: both {packed.name} and {plain.name} hold the rounds of "
                         f"grid {grid}: remove the stale one (a report writes {packed.name})")
    return packed if packed.is_file() else plain if plain.is_file() else None


def save_png(fig: Figure, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` as a palette PNG (:func:`palette_png`) at ``dpi``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    path.write_bytes(palette_png(buf.getvalue()))
    return path


def palette_png(data: bytes) -> bytes:
    """A PNG's bytes with its pixels on a palette of 256 colours (octree, no dithering: flat
    colours stay flat), on white where it was transparent, optimised; the same input gives the
    same bytes. Already a palette image: returned as it is."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if image.mode == "P":
            return data
        dpi = image.info.get("dpi")
        rgba = image.convert("RGBA")
    rgb = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")
    palette = rgb.quantize(colors=256, method=Image.Quantize.FASTOCTREE,
                           dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True, **({"dpi": dpi} if dpi else {}))
    return out.getvalue()
