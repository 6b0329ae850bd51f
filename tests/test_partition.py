"""Tests for fedowen_task.partition (and its held-out sets, fedowen_task.holdout, and its
writer schemes, fedowen_task.writers)."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_task import dirichlet
from fedowen_task.config import TaskConfig
from fedowen_task.data import DatasetArrays
from fedowen_task.holdout import holdout_split, server_eval_split
from fedowen_task.partition import (
    federated_split,
    long_tail_counts,
    long_tail_indices,
    partition_indices,
)
from fedowen_task.pool import check_clients_fit, client_pool
from fedowen_task.writers import writer_partition, writer_sample

# MNIST's training class counts: realistic, slightly unequal pools without loading data.
MNIST_COUNTS = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)


def labels_with(counts: tuple[int, ...], seed: int = 0) -> np.ndarray:
    labels = np.repeat(np.arange(len(counts)), counts)
    return np.random.default_rng(seed).permutation(labels).astype(np.int64)


@pytest.fixture(scope="module")
def mnist_like() -> np.ndarray:
    return labels_with(MNIST_COUNTS)


def fake_dataset(labels: np.ndarray, writers: np.ndarray | None = None) -> DatasetArrays:
    n = len(labels)
    return DatasetArrays(
        name="fake",
        x_train=np.zeros((n, 1, 2, 2), dtype=np.uint8),
        y_train=labels,
        x_test=np.zeros((1, 1, 2, 2), dtype=np.uint8),
        y_test=labels[:1],
        num_classes=int(labels.max()) + 1,
        in_channels=1,
        writer_train=writers,
    )


def assert_disjoint(parts: list[np.ndarray]) -> np.ndarray:
    union = np.concatenate(parts)
    assert len(np.unique(union)) == len(union)
    return union


@pytest.mark.parametrize("imbalance_factor", [0.01, 0.05, 0.1])
def test_long_tail_head_to_tail_ratio_is_one_over_if(
    mnist_like: np.ndarray, imbalance_factor: float
) -> None:
    # Execute
    kept = long_tail_indices(mnist_like, imbalance_factor, 0)
    # Assert
    counts = np.bincount(mnist_like[kept])
    assert counts.max() / counts.min() == pytest.approx(1 / imbalance_factor, rel=0.05)
    ranked = np.sort(counts)[::-1]
    expected = ranked[0] * imbalance_factor ** (np.arange(10) / 9)
    np.testing.assert_allclose(ranked, expected, rtol=0.05, atol=1)


def test_long_tail_counts_by_hand() -> None:
    # 3 classes, ranks 0..2, IF 0.25: ratios 1, 0.5, 0.25; class 2 (rank 2) limits n_max to 400
    counts = long_tail_counts(np.array([1000, 1000, 100]), np.array([0, 1, 2]), 0.25)
    np.testing.assert_array_equal(counts, [400, 200, 100])


def test_long_tail_if_one_is_balanced_and_seed_picks_the_head(mnist_like: np.ndarray) -> None:
    balanced = np.bincount(mnist_like[long_tail_indices(mnist_like, 1.0, 0)])
    assert set(balanced) == {min(MNIST_COUNTS)}
    heads = {
        int(np.bincount(mnist_like[long_tail_indices(mnist_like, 0.1, s)]).argmax())
        for s in range(8)
    }
    assert len(heads) > 1


@pytest.mark.parametrize("scheme", ["per-class", "per-client"])
def test_partition_is_disjoint_and_covers_the_kept_samples(
    mnist_like: np.ndarray, scheme: str
) -> None:
    # Execute
    parts = partition_indices(mnist_like, 20, 0.5, 0.05, seed=3, min_size=10, scheme=scheme)
    # Assert
    union = assert_disjoint(parts)
    expected = long_tail_counts(np.array(MNIST_COUNTS), np.arange(10), 0.05)
    np.testing.assert_array_equal(np.sort(np.bincount(mnist_like[union])), np.sort(expected))
    assert all(np.all(np.diff(p) > 0) and p.dtype == np.int64 for p in parts)


@pytest.mark.parametrize("scheme", ["per-class", "per-client"])
def test_alpha_001_gives_at_most_two_classes_and_min_size_for_100_clients(
    mnist_like: np.ndarray, scheme: str
) -> None:
    # Execute
    parts = partition_indices(mnist_like, 100, 0.01, 0.01, seed=0, min_size=10, scheme=scheme)
    # Assert
    assert len(parts) == 100
    assert min(len(p) for p in parts) >= 10
    classes = np.array([len(np.unique(mnist_like[p])) for p in parts])
    assert np.mean(classes <= 2) >= 0.8


def test_per_class_plain_draw_leaves_clients_empty_so_top_up_is_needed(
    mnist_like: np.ndarray,
) -> None:
    rng = np.random.default_rng(0)
    owner = dirichlet.split_per_class(mnist_like, 100, 0.01, rng)
    assert np.sum(np.bincount(owner, minlength=100) == 0) > 20
    dirichlet.top_up(owner, mnist_like, 100, 10, rng)
    assert np.bincount(owner, minlength=100).min() >= 10


def test_alpha_100_is_near_uniform(mnist_like: np.ndarray) -> None:
    for scheme in ("per-class", "per-client"):
        parts = partition_indices(mnist_like, 10, 100.0, 1.0, seed=1, scheme=scheme)
        props = np.array([np.bincount(mnist_like[p], minlength=10) / len(p) for p in parts])
        # Dir(100) sd ~0.01; per-client's last client takes the leftovers, so it is excluded
        np.testing.assert_allclose(props[:-1], 0.1, atol=0.05)
        assert np.median(np.abs(props - 0.1)) < 0.02
        sizes = np.array([len(p) for p in parts])
        assert sizes.max() / sizes.min() < 1.25  # per-class sizes: relative sd ~3%


def test_per_client_sizes_equal_up_to_rounding(mnist_like: np.ndarray) -> None:
    parts = partition_indices(mnist_like, 7, 0.1, 0.05, seed=2, min_size=1, scheme="per-client")
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() - sizes.min() <= 1


@pytest.mark.parametrize("scheme", ["per-class", "per-client"])
def test_same_seed_same_split_other_seed_different(mnist_like: np.ndarray, scheme: str) -> None:
    def split(seed: int) -> list[np.ndarray]:
        return partition_indices(mnist_like, 10, 0.1, 0.05, seed, scheme=scheme)

    a, b, c = split(5), split(5), split(6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_too_few_samples_for_min_size_fails_loudly() -> None:
    with pytest.raises(ValueError, match="min_size"):
        partition_indices(labels_with((30, 30)), 10, 0.1, 1.0, seed=0, min_size=10)
    with pytest.raises(ValueError, match="scheme"):
        partition_indices(labels_with((30, 30)), 2, 0.1, 1.0, seed=0, scheme="iid")
    with pytest.raises(ValueError, match="imbalance_factor"):
        partition_indices(labels_with((30, 30)), 2, 0.1, 1.5, seed=0, min_size=1)


def test_imbalance_factor_zero_keeps_the_data_own_class_counts() -> None:
    labels = labels_with((300, 40, 7))
    np.testing.assert_array_equal(long_tail_indices(labels, 0.0, 0), np.arange(len(labels)))
    parts = partition_indices(labels, 4, 0.5, 0.0, seed=0, min_size=1)
    assert sum(len(p) for p in parts) == len(labels)
    # while 1.0 balances by cutting every class to the rarest
    assert len(long_tail_indices(labels, 1.0, 0)) == 3 * 7


def test_validation_set_is_nobodys_data_and_leaves_splits_alone_when_off(
        mnist_like: np.ndarray) -> None:
    # Prepare
    ds = fake_dataset(mnist_like)
    off = federated_split(ds, num_clients=20, alpha=0.1, imbalance_factor=0.01, seed=3)
    # Execute
    on = federated_split(ds, num_clients=20, alpha=0.1, imbalance_factor=0.01, seed=3,
                         validation_fraction=0.05)
    eval_idx, val_idx, pool = holdout_split(mnist_like, 0.01, 0.05, 3)
    # Assert: the evaluation set does not move; the validation set is stratified, 5% of the
    # pool, and disjoint from the evaluation set and every client
    np.testing.assert_array_equal(on.eval_idx, off.eval_idx)
    np.testing.assert_array_equal(on.val_idx, val_idx)
    assert len(np.intersect1d(val_idx, eval_idx)) == 0
    assert len(np.intersect1d(assert_disjoint(list(on.client_idx)), val_idx)) == 0
    assert len(eval_idx) + len(val_idx) + len(pool) == len(mnist_like)
    per_class = np.bincount(mnist_like[val_idx], minlength=10)
    expected = np.bincount(mnist_like[np.setdiff1d(np.arange(len(mnist_like)), eval_idx)])
    np.testing.assert_allclose(per_class, 0.05 * expected, atol=1)
    # off: no validation set, and the clients' data exactly as before the key existed
    assert len(off.val_idx) == 0
    before = partition_indices(mnist_like[server_eval_split(mnist_like, 0.01, 3)[1]], 20, 0.1,
                               0.01, np.random.SeedSequence(3).spawn(1)[0])
    pool_off = server_eval_split(mnist_like, 0.01, 3)[1]
    assert all(np.array_equal(a, pool_off[b])
               for a, b in zip(off.client_idx, before, strict=True))
    with pytest.raises(ValueError, match="validation_fraction"):
        holdout_split(mnist_like, 0.01, 1.0, 0)


def test_server_eval_split_is_stratified_and_disjoint() -> None:
    labels = labels_with((1000, 500, 120, 2, 1))
    eval_idx, train_idx = server_eval_split(labels, 0.01, seed=0)
    np.testing.assert_array_equal(np.bincount(labels[eval_idx], minlength=5), [10, 5, 1, 1, 0])
    assert len(np.intersect1d(eval_idx, train_idx)) == 0
    assert len(eval_idx) + len(train_idx) == len(labels)


def test_federated_split_eval_set_never_reaches_clients(mnist_like: np.ndarray) -> None:
    # Prepare
    ds = fake_dataset(mnist_like)
    # Execute
    split = federated_split(ds, num_clients=100, alpha=0.01, imbalance_factor=0.01, seed=0)
    # Assert
    union = assert_disjoint(list(split.client_idx))
    assert len(np.intersect1d(union, split.eval_idx)) == 0
    assert len(split.eval_idx) == pytest.approx(0.01 * len(mnist_like), rel=0.01)
    assert split.sizes.min() >= 10 and split.num_clients == 100
    assert not split.eval_idx.flags.writeable
    # the server rebuilds the same set from the seed alone
    np.testing.assert_array_equal(split.eval_idx, server_eval_split(mnist_like, 0.01, 0)[0])
    again = federated_split(ds, num_clients=100, alpha=0.01, imbalance_factor=0.01, seed=0)
    assert again is split  # cached per process


def test_writer_partition_groups_whole_writers() -> None:
    writers = np.random.default_rng(0).integers(0, 40, size=2000)
    parts = writer_partition(writers, 10, seed=0)
    assert_disjoint(parts)
    assert sum(len(p) for p in parts) == len(writers)
    owners = [set(writers[p].tolist()) for p in parts]
    assert all(not (a & b) for i, a in enumerate(owners) for b in owners[i + 1 :])
    assert {len(o) for o in owners} == {4}
    one_each = writer_partition(writers, 40, seed=0)
    assert all(len(np.unique(writers[p])) == 1 for p in one_each)
    with pytest.raises(ValueError, match="writers"):
        writer_partition(writers, 41, seed=0)


def test_federated_split_writer_scheme() -> None:
    labels = labels_with((400, 400, 400))
    writers = np.random.default_rng(1).integers(0, 30, size=len(labels))
    split = federated_split(
        fake_dataset(labels, writers), num_clients=10, alpha=1.0, imbalance_factor=1.0,
        seed=0, scheme="writer", min_size=1,
    )  # fmt: skip
    assert split.num_clients == 10
    assert len(np.intersect1d(np.concatenate(split.client_idx), split.eval_idx)) == 0
    with pytest.raises(ValueError, match="writers"):
        federated_split(
            fake_dataset(labels), num_clients=2, alpha=1.0, imbalance_factor=1.0, seed=0,
            scheme="writer",
        )  # fmt: skip


def test_writer_sample_draws_the_same_writers_as_clients_for_every_run_seed() -> None:
    labels = labels_with((400, 400, 400))
    writers = np.random.default_rng(1).integers(0, 30, size=len(labels))
    parts = writer_sample(writers, 10)
    assert all(len(np.unique(writers[p])) == 1 for p in parts)  # one writer, one client
    assert len({int(writers[p][0]) for p in parts}) == 10
    assert sum(len(p) for p in parts) == sum(int((writers == writers[p][0]).sum())
                                             for p in parts)  # all of each drawn writer
    # the federation is fixed: seeds 0 and 7 federate the same writers
    drawn = [
        {int(ds_writers[idx][0]) for idx in split.client_idx}
        for ds_writers, split in (
            (writers, federated_split(fake_dataset(labels, writers), num_clients=10, alpha=1.0,
                                      imbalance_factor=0.0, seed=s, scheme="writer-sample",
                                      min_size=1))
            for s in (0, 7))
    ]
    assert drawn[0] == drawn[1]
    with pytest.raises(ValueError, match="writers"):
        writer_sample(writers, 31)


@pytest.mark.parametrize("scheme", ["per-class", "per-client", "writer"])
def test_client_pool_is_what_the_split_divides(scheme: str) -> None:
    labels = labels_with((300, 200, 100))
    writers = np.random.default_rng(2).integers(0, 40, size=len(labels))
    ds = fake_dataset(labels, writers)
    for seed in (0, 7):
        # Execute
        split = federated_split(ds, num_clients=8, alpha=0.5, imbalance_factor=0.1, seed=seed,
                                scheme=scheme, min_size=1, eval_fraction=0.05,
                                validation_fraction=0.1)
        pool = client_pool(ds, imbalance_factor=0.1, seed=seed, eval_fraction=0.05,
                           validation_fraction=0.1)
        # Assert: the same samples, drawn by the same seeds
        assert np.array_equal(np.sort(np.concatenate(split.client_idx)), np.sort(pool))


def test_a_federation_too_large_for_the_pool_is_named_in_the_run_configs_words() -> None:
    ds = fake_dataset(labels_with((400, 150)))
    cfg = TaskConfig(imbalance_factor=0.0, min_partition_size=10, eval_fraction=0.01)
    kept = len(client_pool(ds, imbalance_factor=0.0, seed=cfg.seed, eval_fraction=0.01))
    # Execute / Assert: the most clients that fit pass, and split; one more fails, naming keys
    check_clients_fit(ds, cfg, kept // 10)
    federated_split(ds, num_clients=kept // 10, alpha=0.1, imbalance_factor=0.0,
                    seed=cfg.seed, min_size=10)
    with pytest.raises(ValueError, match=(
            rf"clients' pool keeps {kept} of 550 .* too few for {kept // 10 + 1} clients of "
            rf"min-partition-size=10: run at most {kept // 10} clients")):
        check_clients_fit(ds, cfg, kept // 10 + 1)

