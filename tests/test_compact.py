"""Report files kept small for git (sim.compact): compressed CSVs with fixed bytes that read back
as the plain ones, the rounds file a reader picks, palette PNGs."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import pytest

from sim.compact import ROUNDS_SUFFIX, open_csv, palette_png, rounds_file, save_png

ROWS = [["variant", "seed", "round", "test_accuracy"], ["fedowen", "0", "1", "12.5"],
        ["fedavg", "0", "1", "9.87"]]


def write(path: Path) -> bytes:
    with open_csv(path, "w") as fh:
        csv.writer(fh).writerows(ROWS)
    return path.read_bytes()


def test_a_compressed_csv_has_fixed_bytes_and_reads_back_as_the_plain_one(
        tmp_path: Path) -> None:
    # Prepare: the plain CSV an older report wrote under the same name
    plain = tmp_path / "g-rounds.csv"
    plain_bytes = write(plain)
    # Execute
    first = write(tmp_path / f"g{ROUNDS_SUFFIX}")
    (tmp_path / "other").mkdir()
    second = write(tmp_path / "other" / f"g{ROUNDS_SUFFIX}")
    with open_csv(tmp_path / f"g{ROUNDS_SUFFIX}") as fh:
        back = list(csv.reader(fh))
    # Assert: the same rows, the same bytes (no name or time in the header), the plain file's
    # bytes inside; the stale plain copy is gone
    assert first == second and gzip.decompress(first) == plain_bytes
    assert first[4:8] == b"\0\0\0\0"  # gzip's mtime field
    assert back == ROWS
    assert not plain.exists()


def test_a_reader_takes_the_compressed_rounds_or_an_older_plain_file_never_both(
        tmp_path: Path) -> None:
    # Prepare / Execute / Assert
    assert rounds_file(tmp_path, "g") is None
    write(tmp_path / "g-rounds.csv")
    assert rounds_file(tmp_path, "g") == tmp_path / "g-rounds.csv"
    (tmp_path / "g-rounds.csv.gz").write_bytes(gzip.compress(b"x"))
    with pytest.raises(SystemExit, match=r"both g-rounds\.csv\.gz and g-rounds\.csv"):
        rounds_file(tmp_path, "g")
    (tmp_path / "g-rounds.csv").unlink()
    assert rounds_file(tmp_path, "g") == tmp_path / "g-rounds.csv.gz"


def test_a_plot_is_written_on_a_palette_with_its_size_and_fixed_bytes(tmp_path: Path) -> None:
    # Prepare: a plot with bands, as the reports draw them
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, ax = plt.subplots(figsize=(4, 3))
    for k in range(5):
        ax.plot(range(50), [k + (i % 7) for i in range(50)])
        ax.fill_between(range(50), k - 1, k + 1, alpha=0.1)
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=110)
    # Execute
    save_png(fig, tmp_path / "a.png", dpi=110)
    save_png(fig, tmp_path / "b.png", dpi=110)
    plt.close(fig)
    # Assert: same pixels' size, a palette, smaller than matplotlib's RGBA, the same bytes
    # twice; a palette PNG is left as it is
    with Image.open(tmp_path / "a.png") as small, Image.open(rgba) as full:
        assert small.mode == "P" and small.size == full.size
        assert len(small.getcolors() or []) <= 256
    assert (tmp_path / "a.png").stat().st_size < len(rgba.getvalue())
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert palette_png((tmp_path / "a.png").read_bytes()) == (tmp_path / "a.png").read_bytes()
