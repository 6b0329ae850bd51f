"""The cells of a preset whose federation their data cannot split, found before any runs.

Such a cell's ClientApps would all raise in its first seconds, seed after seed
(:func:`fedowen_task.pool.check_clients_fit`); a preset of hundreds of cells would then end
with a column of failures. :func:`unfit_cells` reads each selected cell's run config against
the preset's ``num-supernodes``, loading each dataset once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedowen_task.data import DatasetArrays, load_dataset
from fedowen_task.pool import check_clients_fit
from sim.grid import Cell


def unfit_cells(cells: Sequence[Cell], num_clients: int, data_dir: Path) -> dict[str, str]:
    """Cell id -> why ``num_clients`` partitions cannot be cut from its data, for each cell
    whose clients' pool is too small."""
    datasets: dict[tuple[str, bool], DatasetArrays] = {}
    verdicts: dict[tuple[object, ...], str] = {}
    out: dict[str, str] = {}
    for cell in cells:
        cfg = cell.config
        key = (cfg.dataset, cfg.imbalance_factor, cfg.seed, cfg.eval_fraction,
               cfg.validation_fraction, cfg.min_partition_size)
        if key not in verdicts:
            data = (cfg.dataset, cfg.download)
            if data not in datasets:
                datasets[data] = load_dataset(cfg.dataset, data_dir, download=cfg.download)
            try:
                check_clients_fit(datasets[data], cfg, num_clients)
                verdicts[key] = ""
            except ValueError as err:
                verdicts[key] = str(err)
        if verdicts[key]:
            out[cell.cell_id] = verdicts[key]
    return out
