"""Atomic per-round checkpoints of a FedOwen run.

One file, ``checkpoint.npz``, holds the global model's arrays and the strategy's state as
JSON (round, phi, selection counters, node map, generator states), plus the run-config keys
that shape the model and the federation and their hash, so a resume can refuse a checkpoint
made under other settings (:func:`check_run_config`). It is written to a temporary file in
the same directory and moved into place with ``os.replace``, so a crash at any instant leaves
either the previous checkpoint or the new one, never a torn file. Reading refuses damaged
files and models holding NaN/Inf with a :class:`CheckpointError` that says what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

CHECKPOINT_FILE = "checkpoint.npz"
_STATE_KEY = "__strategy_state__"
_ARRAY_PREFIX = "array:"


class CheckpointError(ValueError):
    """A checkpoint that cannot or must not be resumed from (the message says why)."""


@dataclass(frozen=True)
class Checkpoint:
    """What a resumed run needs: the last completed round, its model, the strategy state, and
    the run config it was made under (empty for checkpoints older than this field)."""

    server_round: int
    global_state: dict[str, NDArray]
    strategy_state: dict[str, Any]
    run_config: dict[str, Any] = field(default_factory=dict)


def config_hash(run_config: Mapping[str, Any]) -> str:
    """SHA-256 of the run config as canonical JSON (sorted keys)."""
    text = json.dumps(dict(run_config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def save_checkpoint(path: str | Path, server_round: int, global_state: Mapping[str, NDArray],
                    strategy_state: Mapping[str, Any],
                    run_config: Mapping[str, Any] | None = None) -> Path:
    """Write the checkpoint of ``server_round`` atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"server_round": server_round, **strategy_state}
    if run_config is not None:
        meta.update(run_config=dict(run_config), config_hash=config_hash(run_config))
    arrays: dict[str, Any] = {f"{_ARRAY_PREFIX}{k}": np.asarray(v)
                              for k, v in global_state.items()}
    arrays[_STATE_KEY] = np.array(json.dumps(meta))
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

    Raises
    ------
    FileNotFoundError
        No checkpoint there.
    CheckpointError
        The file is damaged or not a checkpoint, its config hash does not match, or its model
        holds NaN/Inf.
    """
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: point resume-from at a run's output "
                                f"directory (it holds {CHECKPOINT_FILE} after round 1)")
    try:
        with np.load(path, allow_pickle=False) as data:
            state = json.loads(str(data[_STATE_KEY]))
            arrays = {k[len(_ARRAY_PREFIX):]: data[k] for k in data.files
                      if k.startswith(_ARRAY_PREFIX)}
        server_round = int(state.pop("server_round"))
    except (OSError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile) as err:
        raise CheckpointError(
            f"checkpoint {path} is damaged or not a FedOwen checkpoint "
            f"({type(err).__name__}: {err}); delete it to start the run afresh, or point "
            "resume-from at another run's output directory") from err
    run_config = state.pop("run_config", {})
    stored_hash = state.pop("config_hash", None)
    if run_config and stored_hash != config_hash(run_config):
        raise CheckpointError(f"checkpoint {path}: its run config does not match its hash "
                              "(edited or damaged); start the run afresh")
    for key, arr in arrays.items():
        if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
            raise CheckpointError(
                f"checkpoint {path} (round {server_round}): array {key!r} holds NaN or Inf, "
                "the model diverged; resuming would continue a broken model. Start afresh "
                "(e.g. with a lower lr) instead")
    return Checkpoint(server_round, arrays, state, run_config)


def check_run_config(ckpt: Checkpoint, current: Mapping[str, Any], where: str | Path,
                     defaults: Mapping[str, Any] | None = None) -> None:
    """Refuse to resume ``ckpt`` under a ``current`` run config whose keys differ.

    A key the checkpoint does not record (added to the schema after it was made) counts as
    equal when its current value is its default in ``defaults``: new keys default to the old
    behaviour, so a run started before them can still be resumed.

    Raises
    ------
    CheckpointError
        Naming every differing key with the checkpoint's value and the current one.
    """
    if not ckpt.run_config:
        return  # a checkpoint from before run configs were recorded: nothing to compare
    keys = sorted(set(ckpt.run_config) | set(current))
    added = {k for k in keys if k not in ckpt.run_config and defaults is not None
             and k in defaults and current.get(k) == defaults[k]}
    diff = [f"{k}={ckpt.run_config.get(k)!r} (now {current.get(k)!r})" for k in keys
            if k not in added and ckpt.run_config.get(k) != current.get(k)]
    if diff:
        raise CheckpointError(
            f"the checkpoint in {where} was made with other settings: {'; '.join(diff)}. "
            "Resume with the run config it was made with, or start a new run without "
            "resume-from")
