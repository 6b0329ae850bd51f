"""Coalition scores per block of the evaluation set (benchmarks/record_eval_blocks.py): the
blocks cut the set, and their score sums add up to the whole set's game."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.bench_eval_subsets import unions
from benchmarks.record_app_games import Cell, split_halves, table_of
from benchmarks.record_eval_blocks import block_tables, blocks_of
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_task.models import build_model, state_to_numpy


def test_blocks_cut_the_set_into_disjoint_near_equal_parts() -> None:
    # Execute: 23 images in blocks of 5 -> 4 blocks of 6, 6, 6, 5 (array_split)
    blocks = blocks_of(23, 5, seed=0)
    # Assert
    assert sorted(len(b) for b in blocks) == [5, 6, 6, 6]
    assert sorted(np.concatenate(blocks).tolist()) == list(range(23))
    with pytest.raises(ValueError, match="block size 30 must lie in"):
        blocks_of(23, 30, seed=0)


def test_unions_are_all_combinations_when_few() -> None:
    rng = np.random.default_rng(0)
    assert unions(4, 2, 10, rng) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert len(set(unions(12, 5, 30, rng))) == 30


def test_block_sums_add_up_to_the_whole_sets_game() -> None:
    # Prepare: a LeNet round of 3 clients on 40 random images
    model = build_model("lenet", 1, 10, seed=0)
    rng = np.random.default_rng(0)
    glob = state_to_numpy(model)
    states = [{k: v + rng.normal(0, 0.05, v.shape).astype(v.dtype) for k, v in glob.items()}
              for _ in range(3)]
    x = torch.randn(40, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (40,), generator=torch.Generator().manual_seed(2))
    kept = {"global": glob, "states": states, "num_examples": [10, 20, 30],
            "shares": [1 / 3] * 3}
    factory = CoalitionUtility(model, x, y, metric="neg-loss", device="cpu")
    whole = factory(glob, states, [10, 20, 30], shares=[1 / 3] * 3)
    # Execute
    sums, _ = block_tables(factory, kept, blocks_of(40, 10, seed=3))
    # Assert: 4 blocks of 10; their sums over 40 images are the whole set's utilities
    assert sums.shape == (4, 8)
    np.testing.assert_allclose(sums.sum(axis=0) / 40, table_of(whole)[0], rtol=0, atol=1e-6)


def test_another_model_names_its_games_and_leaves_the_recorded_split_alone() -> None:
    # Prepare: the committed battery's manifest, written before its games were recorded
    halves = json.loads((Path(__file__).parent / "data/games/manifest.json").read_text())
    cells = []
    for key in halves["halves"]:
        dataset, alpha, rnd, seed = key.rsplit("_", 3)
        cells.append(Cell(dataset, float(alpha[1:]), int(rnd[1:]), int(seed[1:])))
    resnet = [Cell("cifar10", 0.1, 3, s, "resnet18") for s in (0, 1)]
    # Execute
    split = split_halves(cells + resnet)
    # Assert: the recorded games keep their halves; ResNet-18's are named apart, one a half
    assert {k: split[k] for k in halves["halves"]} == halves["halves"]
    assert Cell("cifar10", 0.1, 3, 0, "cnn").key == "cifar10_a0.1_r03_s0"
    assert sorted(split[c.key] for c in resnet) == ["dev", "report"]
    assert resnet[0].key == "cifar10-resnet18_a0.1_r03_s0"
