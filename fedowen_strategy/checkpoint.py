"""Atomic per-round checkpoints of a FedOwen run.

One file, ``checkpoint.npz``, holds the global model's arrays and the strategy's state as
JSON (round, phi, selection counters, node map, generator states). It is written to a
temporary file in the same directory and moved into place with ``os.replace``, so a crash at
any instant leaves either the previous checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

CHECKPOINT_FILE = "checkpoint.npz"
_STATE_KEY = "__strategy_state__"
_ARRAY_PREFIX = "array:"


@dataclass(frozen=True)
class Checkpoint:
    """What a resumed run needs: the last completed round, its model, the strategy state."""

    server_round: int
    global_state: dict[str, NDArray]
    strategy_state: dict[str, Any]


def save_checkpoint(path: str | Path, server_round: int, global_state: Mapping[str, NDArray],
                    strategy_state: Mapping[str, Any]) -> Path:
    """Write the checkpoint of ``server_round`` atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"server_round": server_round, **strategy_state})
    arrays: dict[str, Any] = {f"{_ARRAY_PREFIX}{k}": np.asarray(v)
                              for k, v in global_state.items()}
    arrays[_STATE_KEY] = np.array(payload)
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`.

    ``path`` may be the file or the run's output directory holding ``checkpoint.npz``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: point resume-from at a run's output "
                                f"directory (it holds {CHECKPOINT_FILE} after round 1)")
    with np.load(path, allow_pickle=False) as data:
        state = json.loads(str(data[_STATE_KEY]))
        arrays = {k[len(_ARRAY_PREFIX):]: data[k] for k in data.files
                  if k.startswith(_ARRAY_PREFIX)}
    return Checkpoint(int(state.pop("server_round")), arrays, state)
