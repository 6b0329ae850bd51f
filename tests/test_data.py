"""Tests for fedowen_task.data: the five loaders on the offline copies, caching, errors."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedowen_task import data
from fedowen_task.data import (
    DATASETS,
    DatasetNotFoundError,
    load_dataset,
    resolve_data_dir,
    to_tensor,
)

# name: (train, test, classes, (C, H, W))
EXPECTED = {
    "mnist": (60000, 10000, 10, (1, 28, 28)),
    "fashion-mnist": (60000, 10000, 10, (1, 28, 28)),
    "cifar10": (50000, 10000, 10, (3, 32, 32)),
    "medmnist": (546, 156, 2, (1, 28, 28)),
    "femnist": (54210, 6221, 62, (1, 28, 28)),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_loader_shapes_dtypes_and_classes(shared_data_dir: Path, name: str) -> None:
    # Prepare
    n_train, n_test, n_classes, chw = EXPECTED[name]
    # Execute
    ds = load_dataset(name, shared_data_dir)
    # Assert
    assert ds.x_train.shape == (n_train, *chw) and ds.x_test.shape == (n_test, *chw)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    assert ds.y_train.shape == (n_train,) and ds.y_test.shape == (n_test,)
    assert ds.num_classes == n_classes and ds.in_channels == chw[0]
    assert set(np.unique(ds.y_train)) <= set(range(n_classes))
    assert len(np.unique(ds.y_test)) == n_classes
    assert not ds.x_train.flags.writeable
    assert load_dataset(name, shared_data_dir) is ds  # in-process cache


def test_medmnist_default_flag_and_femnist_details(shared_data_dir: Path) -> None:
    assert load_dataset("medmnist", shared_data_dir).name == "medmnist:breastmnist"
    assert load_dataset("medmnist:breastmnist", shared_data_dir).num_classes == 2
    fem = load_dataset("femnist", shared_data_dir)
    assert fem.writer_train is not None and fem.writer_train.shape == fem.y_train.shape
    assert fem.writer_test is not None and len(np.unique(fem.writer_train)) == 396
    # inverted: background (the corner pixel) is dark, as in MNIST
    assert np.median(fem.x_train[:, 0, 0, 0]) == 0
    assert load_dataset("mnist", shared_data_dir).writer_train is None


def test_cifar_zip_classes_follow_the_official_order(shared_data_dir: Path) -> None:
    ds = load_dataset("cifar10", shared_data_dir)
    np.testing.assert_array_equal(np.bincount(ds.y_train), [5000] * 10)
    # JPEG copy: channel means within 0.005 of the official 0.4914 / 0.4822 / 0.4465
    means = ds.x_train[::10].mean(axis=(0, 2, 3)) / 255
    np.testing.assert_allclose(means, [0.4914, 0.4822, 0.4465], atol=0.005)


def test_cache_file_is_written_then_reused_and_refreshed_when_stale(
    shared_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a private copy of the small BreastMNIST file and an empty cache
    src = tmp_path / "data" / "medmnist"
    src.mkdir(parents=True)
    shutil.copy(shared_data_dir / "medmnist" / "breastmnist.npz", src)
    monkeypatch.setenv("FEDOWEN_CACHE", str(tmp_path / "cache"))
    data._load_cached.cache_clear()
    cache_file = tmp_path / "cache" / "arrays" / "medmnist-breastmnist.npz"
    # Execute / Assert: first load decodes and writes the cache
    first = load_dataset("medmnist", tmp_path / "data")
    assert cache_file.is_file()
    # Reuse: a reader that cannot decode still loads (from the cache file)
    reader = data.READERS["medmnist"]

    def refuse(*_: object) -> dict[str, np.ndarray]:
        raise AssertionError("decoded although the cache is fresh")

    monkeypatch.setitem(data.READERS, "medmnist", dataclasses.replace(reader, decode=refuse))
    data._load_cached.cache_clear()
    again = load_dataset("medmnist", tmp_path / "data")
    np.testing.assert_array_equal(first.x_train, again.x_train)
    # Stale: a changed source file is decoded again
    stat = (src / "breastmnist.npz").stat()
    os.utime(src / "breastmnist.npz", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    data._load_cached.cache_clear()
    with pytest.raises(AssertionError, match="decoded although"):
        load_dataset("medmnist", tmp_path / "data")
    data._load_cached.cache_clear()


def test_missing_data_gives_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDOWEN_CACHE", str(tmp_path / "cache"))
    empty = tmp_path / "empty"
    for name in ("mnist", "fashion-mnist", "cifar10", "medmnist", "femnist"):
        with pytest.raises(DatasetNotFoundError) as info:
            load_dataset(name, empty)
        message = str(info.value)
        assert name in message and str(empty) in message
        assert "FEDOWEN_DATA" in message and "download = true" in message
        assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(DatasetNotFoundError, match="LEAF"):
        load_dataset("femnist", empty, download=True)  # nothing to download from


def test_a_decoded_copy_in_the_cache_never_stands_in_for_a_missing_data_dir(
    shared_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: MNIST decoded once into the cache from the real data dir
    monkeypatch.setenv("FEDOWEN_CACHE", str(tmp_path / "cache"))
    data._load_cached.cache_clear()
    load_dataset("mnist", shared_data_dir)
    # Execute / Assert: another (empty) data dir is an error naming it, not the cached copy
    data._load_cached.cache_clear()
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path / "nowhere")):
        load_dataset("mnist", tmp_path / "nowhere")
    data._load_cached.cache_clear()


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="fashion-mnist"):
        load_dataset("svhn")
    with pytest.raises(ValueError, match="breastmnist"):
        load_dataset("medmnist:organmnist3d")
    assert DATASETS == ("mnist", "fashion-mnist", "cifar10", "medmnist", "femnist")


def test_resolve_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FEDOWEN_DATA", raising=False)
    shared = tmp_path / "shared" / "data"
    assert resolve_data_dir(None, shared) == Path("~/.cache/fedowen/data").expanduser()
    shared.mkdir(parents=True)
    assert resolve_data_dir(None, shared) == shared
    monkeypatch.setenv("FEDOWEN_DATA", str(tmp_path / "env"))
    assert resolve_data_dir(None, shared) == tmp_path / "env"
    assert resolve_data_dir("", shared) == tmp_path / "env"
    assert resolve_data_dir(str(tmp_path / "cfg"), shared) == tmp_path / "cfg"


def test_to_tensor_standardises(shared_data_dir: Path) -> None:
    ds = load_dataset("mnist", shared_data_dir)
    x = to_tensor(ds.x_train[:20000], "mnist")
    assert x.dtype == torch.float32 and x.shape == (20000, 1, 28, 28)
    assert abs(x.mean().item()) < 0.02 and abs(x.std().item() - 1) < 0.02
    with pytest.raises(ValueError, match="expects"):
        to_tensor(ds.x_train[:2], "cifar10")
