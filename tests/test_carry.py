"""Carrying a committed report's rows back as finished cells (sim.carry): the report written
from carried cells is the committed one, row for row, and the runner does not run them again."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from sim.carry import RECORDS, carry_rows, cell_key, is_carried
from sim.cell_state import cell_status
from sim.compact import open_csv
from sim.experiments import archive_cells, restore_cells
from sim.grid import Preset
from sim.presets import parse_preset
from sim.report import write_report

ROUNDS = 4


def ablation_preset() -> Preset:
    # an ablation grid (the confirmation's kind) and a tuning grid, two seeds, two settings
    return parse_preset({
        "preset": {"name": "carry", "num-supernodes": 10, "backend": "inline"},
        "base": {"dataset": "mnist", "num-server-rounds": ROUNDS, "validation-fraction": 0.05},
        "variants": {"owen": {"valuation": "owen"},
                     "equal": {"valuation": "none", "selection": "random",
                               "aggregation": "uniform"}},
        "grid": [{"name": "confirm", "kind": "ablation", "rows": "variant", "reference": "owen",
                  "axes": {"seed": [100, 101], "alpha": [0.1, 0.01],
                           "variant": ["owen", "equal"]}},
                 {"name": "tune", "kind": "tuning", "rows": "variant",
                  "axes": {"seed": [50, 51], "variant": ["owen", "equal"]}}]})


def write_run(out: Path, seed: int, shift: float, rounds: int = ROUNDS) -> None:
    """A run's records as the app writes them: per-client weights, returned ids, seconds;
    accuracies with more digits than the report keeps."""
    out.mkdir(parents=True)
    with (out / "rounds.jsonl").open("w") as fh:
        for rnd in range(rounds + 1):
            rec: dict[str, Any] = {"round": rnd, "test_accuracy": 0.1 + 0.2 * rnd / 3 + shift,
                                   "val_accuracy": 0.12345 + 0.2 * rnd / 7 + shift / 3}
            if rnd:
                rec.update({"returned": [f"c{i}" for i in range(3 + rnd % 2)],
                            "weights": {"c0": 0.5 + seed / 1e4, "c1": 0.3, "c2": 0.2},
                            "round_seconds": 1.23456 * rnd, "valuation_seconds": 0.0567 * rnd})
            fh.write(json.dumps(rec) + "\n")
    (out / "config.json").write_text(json.dumps({"seed": seed, "shift": shift}))
    (out / "code.json").write_text(json.dumps([{"attempt": 1, "commit": "c0ffee",
                                                "dirty": False}]))
    if rounds == ROUNDS:  # the app writes its summary at the end of a run
        (out / "summary.json").write_text(json.dumps({"rounds": rounds}))


def finished_sweep(tmp_path: Path) -> tuple[Preset, Path]:
    preset = parse_preset(ablation_preset().to_json())
    res = tmp_path / "res"
    for i, cell in enumerate(preset.cells()):
        # the last cell stopped at round 2: unfinished, its rows are in the CSV all the same
        write_run(res / cell.cell_id, cell.config.seed, i / 97,
                  rounds=2 if i == len(preset.cells()) - 1 else ROUNDS)
    return preset, res


def test_a_report_from_carried_cells_is_the_committed_report(tmp_path: Path) -> None:
    # Prepare: the committed report of a sweep whose run records were then lost
    preset, res = finished_sweep(tmp_path)
    committed = tmp_path / "committed"
    write_report(preset, res, committed)
    unfinished = preset.cells()[-1]
    # Execute
    counts = carry_rows(preset, committed, tmp_path / "fresh")
    write_report(preset, tmp_path / "fresh", tmp_path / "again")
    # Assert: every finished cell carried, the unfinished one not; each grid's per-round CSV
    # is the committed one less the unfinished cell's rows, the summary CSV the same bytes
    assert sum(counts.values()) == len(preset.cells()) - 1
    assert not (tmp_path / "fresh" / unfinished.cell_id).exists()
    for grid in preset.grids:
        name = f"{grid.name}-rounds.csv.gz"
        gone = cell_key(grid, unfinished) if grid.name == unfinished.grid else None
        kept = [row for row in read_rows(committed / name)
                if tuple(row[k] for k in ("variant", "column", "seed") if k in row) != gone]
        assert read_rows(tmp_path / "again" / name) == kept
        assert len(kept) < len(read_rows(committed / name)) or grid.name != unfinished.grid
    assert (tmp_path / "again" / "confirm-summary.csv").read_text() == \
        (committed / "confirm-summary.csv").read_text() or unfinished.grid == "confirm"
    readme = (tmp_path / "again" / "README.md").read_text()
    assert f"- Carried: {len(preset.cells()) - 1} cells are their committed per-round rows" \
        in readme
    assert "Carried" not in (committed / "README.md").read_text()


def read_rows(path: Path) -> list[dict[str, str]]:
    with open_csv(path) as fh:
        return list(csv.DictReader(fh))


def test_carried_cells_are_done_for_the_runner_and_never_overwrite_a_cell(
        tmp_path: Path) -> None:
    # Prepare: one cell of the fresh dir already ran there
    preset, res = finished_sweep(tmp_path)
    committed = tmp_path / "committed"
    write_report(preset, res, committed)
    own = preset.cells()[0].cell_id
    write_run(tmp_path / "fresh" / own, 100, 0.5)
    (tmp_path / "fresh" / own / "summary.json").write_text('{"own": true}')
    # Execute
    first = carry_rows(preset, committed, tmp_path / "fresh")
    second = carry_rows(preset, committed, tmp_path / "fresh")
    # Assert: the runner sees the carried cells as done; the cell that ran is untouched;
    # carrying twice carries nothing new
    assert sum(first.values()) == len(preset.cells()) - 2 and sum(second.values()) == 0
    assert (tmp_path / "fresh" / own / "summary.json").read_text() == '{"own": true}'
    assert not is_carried(tmp_path / "fresh" / own)
    carried = [c for c in preset.cells() if is_carried(tmp_path / "fresh" / c.cell_id)]
    assert all(cell_status(tmp_path / "fresh", c.cell_id, []) == "done" for c in carried)
    meta = json.loads((tmp_path / "fresh" / carried[0].cell_id / "summary.json").read_text())
    assert meta["rounds"] == ROUNDS and meta["report"] == "committed"


def test_carried_cells_travel_in_the_cell_archive(tmp_path: Path) -> None:
    # Prepare
    preset, res = finished_sweep(tmp_path)
    committed = tmp_path / "committed"
    write_report(preset, res, committed)
    carry_rows(preset, committed, tmp_path / "fresh")
    # Execute
    archive = archive_cells(preset, tmp_path / "fresh", tmp_path / "cells.tar.gz")
    restored = restore_cells(archive, tmp_path / "restored")
    write_report(preset, tmp_path / "fresh", tmp_path / "carried")
    write_report(preset, tmp_path / "restored", tmp_path / "again")
    # Assert: the restored cells report as the carried ones did
    assert restored == len(preset.cells()) - 1
    for name in ("confirm-rounds.csv.gz", "confirm-summary.csv", "tune-rounds.csv.gz",
                 "README.md"):
        assert (tmp_path / "again" / name).read_bytes() == \
            (tmp_path / "carried" / name).read_bytes()


def test_the_records_archive_brings_back_what_the_check_reads(tmp_path: Path) -> None:
    # Prepare: a report whose full archive is then lost (as the archive store of one machine
    # lost five before issue 44)
    import sim.archives as archives

    preset, res = finished_sweep(tmp_path)
    committed = tmp_path / "committed"
    write_report(preset, res, committed)
    kept = archives.keep_archive(preset, res, committed, folder=tmp_path / "parts")
    for part in (tmp_path / "parts").iterdir():
        part.unlink()
    # Execute
    carry_rows(preset, committed, tmp_path / "fresh")
    write_report(preset, tmp_path / "fresh", tmp_path / "again")
    # Assert: beside the manifest, the records archive; every carried cell has its own config
    # and code record back, byte for byte, so `studies.confirmation.pages check` can read them
    assert kept.name == archives.MANIFEST and (committed / RECORDS).is_file()
    carried = [c for c in preset.cells() if is_carried(tmp_path / "fresh" / c.cell_id)]
    assert len(carried) == len(preset.cells()) - 1
    for cell in carried:
        for name in ("config.json", "code.json"):
            assert (tmp_path / "fresh" / cell.cell_id / name).read_bytes() == \
                (res / cell.cell_id / name).read_bytes()
    assert f"their config and code records came from {RECORDS}" in \
        (tmp_path / "again" / "README.md").read_text()


def test_a_report_whose_rounds_are_plain_csv_carries_the_same_cells(tmp_path: Path) -> None:
    # Prepare: a report committed before the per-round CSVs were compressed
    import gzip

    preset, res = finished_sweep(tmp_path)
    committed = tmp_path / "committed"
    write_report(preset, res, committed)
    old = tmp_path / "old"
    write_report(preset, res, old)
    for packed in old.glob("*-rounds.csv.gz"):
        packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
        packed.unlink()
    # Execute
    counts = carry_rows(preset, old, tmp_path / "from-plain")
    write_report(preset, tmp_path / "from-plain", tmp_path / "again")
    carry_rows(preset, committed, tmp_path / "from-packed")
    write_report(preset, tmp_path / "from-packed", tmp_path / "packed")
    # Assert: the same cells carried, the same rows written back (compressed now)
    assert sum(counts.values()) == len(preset.cells()) - 1
    for name in ("confirm-rounds.csv.gz", "tune-rounds.csv.gz"):
        assert (tmp_path / "again" / name).read_bytes() == \
            (tmp_path / "packed" / name).read_bytes()
