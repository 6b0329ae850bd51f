"""One loader for the five benchmark datasets of the FedOwen paper (Sec. 4.1).

``load_dataset(name)`` returns decoded ``uint8`` arrays in ``(N, C, H, W)`` layout for
``mnist``, ``fashion-mnist``, ``cifar10``, ``medmnist:<flag>`` (any 2D single-label MedMNIST
subset; ``medmnist`` alone means ``medmnist:breastmnist``) and ``femnist``.

Where the files are
    The data directory is the run-config value ``data-dir``, else the environment variable
    ``FEDOWEN_DATA``, else ``../shared/data`` beside the repository when it exists, else
    ``~/.cache/fedowen/data`` (:func:`resolve_data_dir`, the one rule). Inside it:
    ``MNIST/raw``, ``FashionMNIST/raw`` (torchvision's layout), ``cifar-10-batches-py`` (the
    official CIFAR-10, as torchvision downloads it) or ``cifar10/cifar10-jpg.zip`` (the offline
    JPEG copy, an ImageFolder tree read straight from the zip), ``medmnist/<flag>.npz`` and
    ``femnist/femnist-leaf-subset.npz``. ``download=True`` lets torchvision / medmnist fetch
    what is missing; FEMNIST has no download (build the npz from LEAF).

Caching
    Decoding is done once: the arrays go to ``<cache>/arrays/<name>.npz`` (``<cache>`` is
    ``FEDOWEN_CACHE`` or ``~/.cache/fedowen``), written atomically, together with a fingerprint
    of the source files (paths, sizes, mtimes) and :data:`CACHE_VERSION`; a changed source or
    version re-decodes. An in-process ``lru_cache`` sits on top, so 100 virtual clients in one
    Ray actor share one read-only copy.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedowen_task.readers import HOW_TO_GET, READERS, DatasetNotFoundError, medmnist_info

__all__ = ["DATASETS", "DatasetArrays", "DatasetNotFoundError", "load_dataset", "to_tensor"]

log = logging.getLogger(__name__)

DATASETS: tuple[str, ...] = ("mnist", "fashion-mnist", "cifar10", "medmnist", "femnist")
DEFAULT_MEDMNIST_FLAG = "breastmnist"
DEFAULT_DATA_DIR = Path("~/.cache/fedowen/data")
#: The offline copies beside a checkout (``<repo>/../shared/data``).
SHARED_DATA_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
DEFAULT_CACHE_DIR = Path("~/.cache/fedowen")
CACHE_VERSION = 1  # bump whenever decoding changes, so stale caches are rebuilt

# Per-channel mean / std of the [0, 1]-scaled training images, used by to_tensor.
# MNIST, Fashion-MNIST and CIFAR-10: the usual published values. FEMNIST: measured on the
# inverted LEAF subset here (ink bright, mostly-black background). MedMNIST: 0.5 / 0.5, as in
# the MedMNIST examples, since subsets differ and only BreastMNIST is available offline.
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "medmnist": ((0.5,), (0.5,)),
    "femnist": ((0.0384,), (0.1640,)),
}

@dataclass(frozen=True, eq=False)
class DatasetArrays:
    """Decoded dataset, read-only arrays.

    ``eq=False`` keeps identity hashing, so an instance can key an ``lru_cache``.

    Attributes
    ----------
    name : str
        Canonical name (``medmnist`` is expanded to ``medmnist:breastmnist``).
    x_train, x_test : np.ndarray
        ``uint8`` images, shape ``(N, C, H, W)``.
    y_train, y_test : np.ndarray
        ``int64`` labels, shape ``(N,)``.
    num_classes, in_channels : int
    writer_train, writer_test : np.ndarray or None
        ``int64`` writer index per sample (FEMNIST only).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    in_channels: int
    writer_train: np.ndarray | None = None
    writer_test: np.ndarray | None = None


def resolve_data_dir(value: str | os.PathLike[str] | None = None,
                     shared: Path = SHARED_DATA_DIR) -> Path:
    """Return the data directory: ``value`` (run config), else ``$FEDOWEN_DATA``, else
    ``shared`` (``<repo>/../shared/data``) when it exists, else ``~/.cache/fedowen/data``.

    Empty strings count as unset. Pass absolute paths from run config: ``flwr run`` executes
    the app from a bundle directory, beside which there is no ``shared`` folder.
    """
    for candidate in (value, os.environ.get("FEDOWEN_DATA")):
        if candidate is not None and str(candidate).strip():
            return Path(candidate).expanduser().resolve()
    if shared.is_dir():
        return shared.resolve()
    return DEFAULT_DATA_DIR.expanduser()


def cache_dir() -> Path:
    """Return the cache root: ``$FEDOWEN_CACHE`` or ``~/.cache/fedowen``."""
    value = os.environ.get("FEDOWEN_CACHE", "").strip()
    return Path(value).expanduser() if value else DEFAULT_CACHE_DIR.expanduser()


def canonical_name(name: str) -> str:
    """Normalise a dataset name; raise ``ValueError`` naming the valid ones."""
    key = name.strip().lower()
    if key == "medmnist":
        return f"medmnist:{DEFAULT_MEDMNIST_FLAG}"
    if key.startswith("medmnist:"):
        medmnist_info(key.split(":", 1)[1])
        return key
    if key not in DATASETS:
        raise ValueError(
            f"Unknown dataset {name!r}; valid names are {', '.join(DATASETS)} "
            f"(medmnist also as medmnist:<flag>, default medmnist:{DEFAULT_MEDMNIST_FLAG})."
        )
    return key


def load_dataset(
    name: str, data_dir: str | os.PathLike[str] | None = None, *, download: bool = False
) -> DatasetArrays:
    """Load a dataset as decoded arrays, from the on-disk cache when possible.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`, or ``medmnist:<flag>``.
    data_dir : str or PathLike, optional
        Folder holding the raw files; ``None`` resolves via :func:`resolve_data_dir`.
    download : bool
        Let torchvision / medmnist download missing files (needs internet).

    Raises
    ------
    ValueError
        Unknown dataset name.
    DatasetNotFoundError
        The files are missing and ``download`` is false (or impossible, for FEMNIST).
    """
    return _load_cached(canonical_name(name), str(resolve_data_dir(data_dir)), download)


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, data_dir: str, download: bool) -> DatasetArrays:
    reader = READERS[name.split(":", 1)[0]]
    root = Path(data_dir)
    source = reader.locate(root, name)
    target = cache_dir() / "arrays" / f"{name.replace(':', '-')}.npz"
    fingerprint = _fingerprint(source) if source is not None else None
    if fingerprint is not None:
        cached = _read_cache(target, fingerprint)
        if cached is not None:
            return _to_arrays(name, cached)
    elif not download:  # never a silent fallback to an older decoded copy elsewhere
        raise DatasetNotFoundError(
            f"Dataset {name!r} not found: searched {root} for {reader.expected(name)}. "
            f"{HOW_TO_GET}"
        )
    log.info("Decoding %s from %s (once; cached in %s)", name, root, target)
    arrays = reader.decode(root, name, download)
    source = reader.locate(root, name)
    _write_cache(target, arrays, _fingerprint(source) if source is not None else "")
    return _to_arrays(name, arrays)


def _fingerprint(paths: list[Path]) -> str:
    parts = [f"v{CACHE_VERSION}"]
    for path in sorted(paths):
        stat = path.stat()
        parts.append(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts)


def _read_cache(path: Path, fingerprint: str | None) -> dict[str, np.ndarray] | None:
    """Return the cached arrays, or ``None`` if absent, unreadable or stale."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            stored = str(npz["fingerprint"])
            if fingerprint is not None and stored != fingerprint:
                log.info("Cache %s is stale (source or version changed); re-decoding", path)
                return None
            if fingerprint is None and not stored.startswith(f"v{CACHE_VERSION}"):
                return None
            return {key: npz[key] for key in npz.files if key != "fingerprint"}
    except (OSError, KeyError, ValueError):
        return None


def _write_cache(path: Path, arrays: dict[str, np.ndarray], fingerprint: str) -> None:
    """Write atomically (temp file + ``os.replace``) so concurrent actors never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            payload: dict[str, Any] = {"fingerprint": np.array(fingerprint), **arrays}
            np.savez(handle, **payload)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared by several users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _to_arrays(name: str, arrays: dict[str, np.ndarray]) -> DatasetArrays:
    for value in arrays.values():
        value.setflags(write=False)  # shared across clients through the lru_cache
    return DatasetArrays(
        name=name,
        x_train=arrays["x_train"],
        y_train=arrays["y_train"],
        x_test=arrays["x_test"],
        y_test=arrays["y_test"],
        num_classes=int(arrays["num_classes"]),
        in_channels=int(arrays["x_train"].shape[1]),
        writer_train=arrays.get("writer_train"),
        writer_test=arrays.get("writer_test"),
    )


def to_tensor(x: np.ndarray, dataset_name: str) -> torch.Tensor:
    """Scale ``uint8`` images to ``[0, 1]`` and standardise with :data:`NORMALIZATION`.

    Returns a new ``float32`` tensor of the same shape ``(N, C, H, W)``.
    """
    family = canonical_name(dataset_name).split(":", 1)[0]
    mean, std = NORMALIZATION[family]
    if x.ndim != 4 or x.shape[1] != len(mean):
        raise ValueError(
            f"to_tensor expects (N, {len(mean)}, H, W) images for {dataset_name}, got {x.shape}"
        )
    out = torch.from_numpy(np.asarray(x, dtype=np.float32) / 255.0)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (out - mean_t) / std_t


def white(dataset: str) -> torch.Tensor:
    """Per channel, the standardised value of intensity 1.0 (shape ``(C, 1, 1)``):
    the backdoor's trigger colour (:mod:`fedowen_task.adversary.backdoor`)."""
    mean, std = NORMALIZATION[canonical_name(dataset).split(":", 1)[0]]
    return ((1.0 - torch.tensor(mean)) / torch.tensor(std)).view(-1, 1, 1)
