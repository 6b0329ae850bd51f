"""Readers of the raw dataset files: where each dataset's files lie and how to decode them.

Each reader locates its source files under the data directory (``None`` when absent) and
decodes them into a dict of arrays ``x_train, y_train, x_test, y_test`` (plus ``writer_*`` for
FEMNIST) in ``uint8`` ``(N, C, H, W)`` layout; :mod:`fedowen_task.data` caches the result.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip

HOW_TO_GET = (
    "Set the run-config key data-dir (or the environment variable FEDOWEN_DATA) to a folder "
    "holding a copy of the data (offline copies live in <project>/../shared/data), or set "
    "download = true (scripts/run.sh --set download=true; flwr run --run-config "
    "\"download=true\") on a machine with internet access."
)


class DatasetNotFoundError(FileNotFoundError):
    """The files of a dataset are not in the data directory."""



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
        f"Dataset {name!r} not found: searched {root} for {expected}. {HOW_TO_GET}"
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


def medmnist_info(flag: str) -> dict[str, object]:
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
    info = medmnist_info(flag)
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


READERS: dict[str, _Reader] = {
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
