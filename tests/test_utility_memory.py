"""Tests for fedowen_strategy.torch_utility.memory: the chunk size follows the memory budget."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedowen_strategy.torch_utility.batched import CoalitionGame
from fedowen_strategy.torch_utility.memory import (
    MAX_CHUNK,
    activation_bytes,
    chunk_from_memory,
    memory_budget,
)
from fedowen_task.models import build_model, state_to_numpy


def test_activation_bytes_counts_every_output() -> None:
    # Linear(3 -> 4), ReLU, a view: two new float32 tensors of 4 values = 32 bytes
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Flatten(0))
    assert activation_bytes(net, torch.zeros(1, 3)) == 32
    assert activation_bytes(net, torch.zeros(5, 3)) == 5 * 32


def test_chunk_from_memory_by_hand() -> None:
    # vmap: every coalition holds its parameters and its activations
    assert chunk_from_memory(1000, 10, 90, "vmap") == 10
    assert chunk_from_memory(999, 10, 90, "vmap") == 9
    # loop: the activations of the one running coalition are paid once
    assert chunk_from_memory(1000, 10, 90, "loop") == 64  # (1000 - 90) // 10 = 91, capped
    assert chunk_from_memory(300, 10, 90, "loop", max_chunk=100) == 21
    # never below one coalition, never above the cap
    assert chunk_from_memory(0, 10, 90, "vmap") == 1
    assert chunk_from_memory(10**12, 10, 90, "vmap") == MAX_CHUNK


def test_budget_is_the_smaller_of_cap_and_half_the_free_memory() -> None:
    cpu = torch.device("cpu")
    assert memory_budget(cpu, 2**30, free_bytes=10 * 2**30) == 2**30
    assert memory_budget(cpu, 2**30, free_bytes=2**29) == 2**28
    assert memory_budget(cpu, 2**40) > 0  # measured: the host's MemAvailable


def test_game_chunk_follows_a_fake_free_memory_figure() -> None:
    # Prepare: LeNet, 10 clients, 50 images; one coalition's parameters take P * 4 bytes
    model = build_model("lenet", 1, 10, seed=0)
    state = state_to_numpy(model)
    x, y = torch.randn(50, 1, 28, 28), torch.randint(0, 10, (50,))
    p_bytes = sum(v.size for v in state.values()) * 4
    common = (model, state, [state] * 10, [1] * 10, x, y)
    act = activation_bytes(model.eval(), x[:1]) * 50  # batch 128 > 50 images: one batch
    # Execute
    games = {free: CoalitionGame(*common, mode="vmap", forward="eager", free_memory_bytes=free,
                                 metric="accuracy")  # exact under any chunking
             for free in (0, 2 * (3 * (p_bytes + act)), 2 * 10**12)}
    loop = CoalitionGame(*common, mode="loop", forward="eager",
                         free_memory_bytes=2 * (act + 5 * p_bytes))
    # Assert
    assert [g.chunk_size for g in games.values()] == [1, 3, MAX_CHUNK]
    assert loop.chunk_size == 5
    masks = np.random.default_rng(0).random((7, 10)) < 0.5
    np.testing.assert_array_equal(games[0](masks), games[2 * 10**12](masks))
