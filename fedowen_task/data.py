"""One loader for the five benchmark datasets of the FedOwen paper (Sec. 4.1).

``load_dataset(name)`` returns decoded ``uint8`` arrays in ``(N, C, H, W)`` layout for
``mnist``, ``fashion-mnist``, ``cifar10``, ``medmnist:<flag>`` (any 2D single-label MedMNIST
subset; ``medmnist`` alone means ``medmnist:breastmnist``) and ``femnist``.

Where the files are
    The data directory is the run-config value ``data-dir``, else the environment variable
    ``FEDOWEN_DATA``, else ``~/.cache/fedowen/data`` (see :func:`resolve_data_dir`). Inside it:
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
import io
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

DATASETS: tuple[str, ...] = ("mnist", "fashion-mnist", "cifar10", "medmnist", "femnist")
DEFAULT_MEDMNIST_FLAG = "breastmnist"
DEFAULT_DATA_DIR = Path("~/.cache/fedowen/data")
DEFAULT_CACHE_DIR = Path("~/.cache/fedowen")
CACHE_VERSION = 1  # bump whenever decoding changes, so stale caches are rebuilt

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip

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

_HOW_TO_GET = (
    "Point the environment variable FEDOWEN_DATA (or the run-config key data-dir) at a folder "
    "holding a copy of the data (offline copies live in <project>/../shared/data), or pass "
    "download=True on a machine with internet access."
)


class DatasetNotFoundError(FileNotFoundError):
    """The files of a dataset are not in the data directory."""


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


def resolve_data_dir(value: str | os.PathLike[str] | None = None) -> Path:
    """Return the data directory: ``value`` (run config), else ``$FEDOWEN_DATA``, else default.

    The default is ``~/.cache/fedowen/data``. Empty strings count as unset. Pass absolute paths
    from run config: ``flwr run`` executes the app from a bundle directory.
    """
    for candidate in (value, os.environ.get("FEDOWEN_DATA")):
        if candidate is not None and str(candidate).strip():
            return Path(candidate).expanduser().resolve()
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
        _medmnist_info(key.split(":", 1)[1])
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
    reader = _READERS[name.split(":", 1)[0]]
    root = Path(data_dir)
    source = reader.locate(root, name)
    target = cache_dir() / "arrays" / f"{name.replace(':', '-')}.npz"
    fingerprint = _fingerprint(source) if source is not None else None
    if fingerprint is not None:
        cached = _read_cache(target, fingerprint)
        if cached is not None:
            return _to_arrays(name, cached)
    elif not download:
        cached = _read_cache(target, None)
        if cached is not None:
            log.info("%s: source files not in %s, using the cache %s", name, root, target)
            return _to_arrays(name, cached)
        raise DatasetNotFoundError(
            f"Dataset {name!r} not found: searched {root} for {reader.expected(name)}. "
            f"{_HOW_TO_GET}"
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


# --- readers: locate the raw files and decode them into a dict of arrays ----------------------


@dataclass(frozen=True)
class _Reader:
    locate: Callable[[Path, str], list[Path] | None]  # source files, or None if absent
    decode: Callable[[Path, str, bool], dict[str, np.ndarray]]
    expected: Callable[[str], str]  # human-readable description of the files looked for


_MNIST_FILES = (
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
)  # fmt: skip
_TV_FOLDERS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}


def _all_exist(paths: list[Path]) -> list[Path] | None:
    return paths if all(p.is_file() for p in paths) else None


def _not_found(name: str, root: Path, expected: str, cause: Exception | None = None) -> Exception:
    err = DatasetNotFoundError(
        f"Dataset {name!r} not found: searched {root} for {expected}. {_HOW_TO_GET}"
    )
    err.__cause__ = cause
    return err


def _decode_torchvision_mnist(root: Path, name: str, download: bool) -> dict[str, np.ndarray]:
    from torchvision import datasets

    cls = datasets.MNIST if name == "mnist" else datasets.FashionMNIST
    out: dict[str, np.ndarray] = {"num_classes": np.array(10)}
    for split, train in (("train", True), ("test", False)):
        try:
            ds = cls(root=str(root), train=train, download=download)
        except RuntimeError as exc:  # torchvision: "Dataset not found. You can use download=True"
            raise _not_found(name, root, f"{_TV_FOLDERS[name]}/raw/*-ubyte", exc) from exc
        out[f"x_{split}"] = ds.data.numpy().astype(np.uint8)[:, None]
        out[f"y_{split}"] = ds.targets.numpy().astype(np.int64)
    return out


def _cifar_official(root: Path) -> list[Path]:
    folder = root / "cifar-10-batches-py"
    return [folder / f"data_batch_{i}" for i in range(1, 6)] + [folder / "test_batch"]


def _locate_cifar(root: Path, _: str) -> list[Path] | None:
    return _all_exist(_cifar_official(root)) or _all_exist([root / "cifar10" / "cifar10-jpg.zip"])


def _decode_cifar(root: Path, name: str, download: bool) -> dict[str, np.ndarray]:
    zip_path = root / "cifar10" / "cifar10-jpg.zip"
    if _all_exist(_cifar_official(root)) is None and zip_path.is_file():
        return _decode_cifar_zip(zip_path)
    from torchvision import datasets

    out: dict[str, np.ndarray] = {"num_classes": np.array(10)}
    for split, train in (("train", True), ("test", False)):
        try:
            ds = datasets.CIFAR10(root=str(root), train=train, download=download)
        except RuntimeError as exc:
            raise _not_found(name, root, _expected_cifar(name), exc) from exc
        out[f"x_{split}"] = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))
        out[f"y_{split}"] = np.asarray(ds.targets, dtype=np.int64)
    return out


def _decode_cifar_zip(path: Path) -> dict[str, np.ndarray]:
    """Read the offline JPEG copy (``<split>/<class name>/<n>.jpg``) without extracting it."""
    from PIL import Image

    out: dict[str, np.ndarray] = {"num_classes": np.array(10)}
    with zipfile.ZipFile(path) as archive:
        members = sorted(n for n in archive.namelist() if n.lower().endswith((".jpg", ".png")))
        for split in ("train", "test"):
            names = [n for n in members if n.startswith(f"{split}/")]
            x = np.empty((len(names), 3, 32, 32), dtype=np.uint8)
            y = np.empty(len(names), dtype=np.int64)
            for i, member in enumerate(names):
                with Image.open(io.BytesIO(archive.read(member))) as img:
                    x[i] = np.asarray(img.convert("RGB")).transpose(2, 0, 1)
                y[i] = CIFAR10_CLASSES.index(member.split("/")[1])
            out[f"x_{split}"], out[f"y_{split}"] = x, y
    return out


def _expected_cifar(_: str) -> str:
    return "cifar-10-batches-py/ (official layout) or cifar10/cifar10-jpg.zip (offline copy)"


def _medmnist_info(flag: str) -> dict[str, object]:
    """MedMNIST metadata for a 2D single-label subset; ``ValueError`` otherwise."""
    from medmnist.info import INFO

    ok = sorted(f for f, i in INFO.items() if not f.endswith("3d") and "multi" not in i["task"])
    if flag not in ok:
        raise ValueError(
            f"Unsupported MedMNIST flag {flag!r}: use one of {', '.join(ok)} "
            "(3D and multi-label subsets are not supported)."
        )
    return dict(INFO[flag])


def _decode_medmnist(root: Path, name: str, download: bool) -> dict[str, np.ndarray]:
    import medmnist

    flag = name.split(":", 1)[1]
    info = _medmnist_info(flag)
    folder = root / "medmnist"
    if download:
        folder.mkdir(parents=True, exist_ok=True)
    cls = getattr(medmnist, str(info["python_class"]))
    out: dict[str, np.ndarray] = {"num_classes": np.array(len(info["label"]))}  # type: ignore[arg-type]
    for split in ("train", "test"):  # the val split is unused: the server set comes from train
        try:
            ds = cls(split=split, root=str(folder), download=download)
        except RuntimeError as exc:
            raise _not_found(name, root, f"medmnist/{flag}.npz", exc) from exc
        imgs = np.asarray(ds.imgs, dtype=np.uint8)
        out[f"x_{split}"] = imgs[:, None] if imgs.ndim == 3 else imgs.transpose(0, 3, 1, 2)
        out[f"y_{split}"] = np.asarray(ds.labels, dtype=np.int64).reshape(-1)
    return out


_FEMNIST_FILE = "femnist/femnist-leaf-subset.npz"


def _decode_femnist(root: Path, name: str, download: bool) -> dict[str, np.ndarray]:
    """LEAF stores white background (255) and dark ink: invert so ink is bright, as in MNIST."""
    path = root / _FEMNIST_FILE
    if not path.is_file():
        raise _not_found(name, root, f"{_FEMNIST_FILE} (no download: build it from LEAF)")
    out: dict[str, np.ndarray] = {"num_classes": np.array(62)}
    with np.load(path) as npz:
        for split in ("train", "test"):
            out[f"x_{split}"] = (255 - npz[f"x_{split}"].astype(np.uint8))[:, None]
            out[f"y_{split}"] = npz[f"y_{split}"].astype(np.int64)
            out[f"writer_{split}"] = npz[f"writer_{split}"].astype(np.int64)
    return out


_READERS: dict[str, _Reader] = {
    **{
        key: _Reader(
            locate=lambda r, n: _all_exist([r / _TV_FOLDERS[n] / "raw" / f for f in _MNIST_FILES]),
            decode=_decode_torchvision_mnist,
            expected=lambda n: f"{_TV_FOLDERS[n]}/raw/*-ubyte (torchvision layout)",
        )
        for key in _TV_FOLDERS
    },
    "cifar10": _Reader(locate=_locate_cifar, decode=_decode_cifar, expected=_expected_cifar),
    "medmnist": _Reader(
        locate=lambda r, n: _all_exist([r / "medmnist" / f"{n.split(':', 1)[1]}.npz"]),
        decode=_decode_medmnist,
        expected=lambda n: f"medmnist/{n.split(':', 1)[1]}.npz (medmnist layout)",
    ),
    "femnist": _Reader(
        locate=lambda r, _: _all_exist([r / _FEMNIST_FILE]),
        decode=_decode_femnist,
        expected=lambda _: _FEMNIST_FILE,
    ),
}
