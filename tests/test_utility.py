"""Tests for fedowen_strategy.torch_utility: the batched coalition utility against the naive
reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_strategy.torch_utility.batched import (
    CoalitionGame,
    choose_mode,
    coalition_coefficients,
)
from fedowen_task.models import build_model, state_to_numpy
from tests.utility_reference import naive_utility

Case = tuple[
    torch.nn.Module,
    dict[str, np.ndarray],
    list[dict[str, np.ndarray]],
    list[int],
    torch.Tensor,
    torch.Tensor,
    np.random.Generator,
]


def _perturbed_states(
    model: torch.nn.Module, n: int, rng: np.random.Generator, scale: float = 0.2
) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """Global state plus n clients: floats perturbed (BN running_var kept positive)."""
    base = state_to_numpy(model)
    clients = []
    for _ in range(n):
        state = {}
        for key, v in base.items():
            if not np.issubdtype(v.dtype, np.floating):
                state[key] = v + rng.integers(0, 5)
            elif key.endswith("running_var"):
                state[key] = (v * rng.uniform(0.5, 1.5, v.shape)).astype(v.dtype)
            else:  # relative noise, so deep nets stay in a sane range
                sd = scale * max(float(v.std()), 1.0 if key.endswith("running_mean") else 0.1)
                state[key] = (v + rng.normal(0.0, sd, v.shape)).astype(v.dtype)
        clients.append(state)
    return base, clients


def _masks(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random masks plus the empty and the grand coalition and a duplicate row."""
    random = rng.random((k, n)) < 0.5
    rows = [np.zeros(n, bool), np.ones(n, bool), *random, random[0]]
    return np.array(rows)


def _setup(name: str, n: int, n_eval: int, seed: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    channels, size = (1, 28) if name == "lenet" else (3, 32)
    model = build_model(name, channels, 10, seed=seed)
    glob, clients = _perturbed_states(model, n, rng, scale=1.0 if name == "lenet" else 0.2)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_eval, channels, size, size, generator=gen)
    y = torch.randint(0, 10, (n_eval,), generator=gen)
    num_examples = rng.integers(10, 100, n).tolist()
    return model, glob, clients, num_examples, x, y, rng


@pytest.mark.parametrize(("mode", "forward"), [("loop", "auto"), ("loop", "eager"),
                                               ("vmap", "auto")])
@pytest.mark.parametrize("metric", ["accuracy", "neg-loss"])
def test_lenet_matches_naive(metric: str, mode: str, forward: str) -> None:
    # Prepare
    model, glob, clients, num_examples, x, y, rng = _setup("lenet", 5, 64)
    masks = _masks(5, 6, rng)
    utility = CoalitionGame(model, glob, clients, num_examples, x, y, metric=metric,
                            device="cpu", mode=mode, batch_size=40, chunk_size=3,
                            forward=forward)
    # Execute
    got = utility(masks)
    expected = naive_utility(model, glob, clients, num_examples, x, y, masks, metric)
    # Assert
    assert got.dtype == np.float64 and got.shape == (len(masks),)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    assert len(np.unique(expected)) > 2  # the check is not vacuous


def test_lenet_accuracy_identical_to_naive_with_the_default_cpu_forward() -> None:
    # Prepare: the default CPU path (rewritten pools, batch 128, chunk from memory) against
    # the naive per-coalition reference (eager model, batch 256), 600 images
    model, glob, clients, num_examples, x, y, rng = _setup("lenet", 8, 600, seed=4)
    masks = _masks(8, 10, rng)
    utility = CoalitionGame(model, glob, clients, num_examples, x, y, device="cpu",
                            metric="accuracy")
    # Execute
    got = utility(masks)
    expected = naive_utility(model, glob, clients, num_examples, x, y, masks, "accuracy")
    # Assert: every correct/incorrect decision is the same, so the values are equal exactly
    assert type(utility._net).__name__ == "LeNet5" and utility.batch_size == 128
    assert isinstance(utility._net, torch.fx.GraphModule)
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(expected)) > 5


@pytest.fixture(scope="module")
def resnet_case() -> tuple[Case, np.ndarray, dict[str, np.ndarray]]:
    """3 clients with perturbed weights and BN running stats, 16 images; naive values once."""
    case = _setup("resnet18", 3, 16, seed=1)
    masks = _masks(3, 2, case[-1])
    expected = {m: naive_utility(*case[:-1], masks, m) for m in ("accuracy", "neg-loss")}
    return case, masks, expected


@pytest.mark.parametrize(
    ("mode", "chunk", "metric"),
    [
        ("loop", None, "neg-loss"),
        ("loop", 1, "neg-loss"),
        ("vmap", None, "neg-loss"),
        ("loop", None, "accuracy"),
        ("vmap", 2, "accuracy"),
    ],
)
def test_resnet18_matches_naive_with_batchnorm(
    resnet_case: tuple[Case, np.ndarray, dict[str, np.ndarray]], mode: str,
    chunk: int | None, metric: str
) -> None:
    # Prepare
    case, masks, expected = resnet_case
    utility = CoalitionGame(*case[:-1], metric=metric, device="cpu", mode=mode,
                            chunk_size=chunk)
    # Execute
    got = utility(masks)
    # Assert
    np.testing.assert_allclose(got, expected[metric], rtol=0, atol=1e-5)
    if metric == "accuracy":
        np.testing.assert_array_equal(got, expected[metric])
    assert len(np.unique(expected[metric])) > 2  # the check is not vacuous


def test_auto_mode_rule() -> None:
    # loop on the CPU whatever the size; on CUDA vmap only for small models (issue 13, H100)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert choose_mode("auto", cpu, 61_706) == "loop"
    assert choose_mode("auto", cuda, 61_706) == "vmap"  # LeNet
    assert choose_mode("auto", cuda, 11_183_562) == "loop"  # ResNet-18 with BN statistics
    assert choose_mode("vmap", cpu, 11_183_562) == "vmap"  # an explicit mode is kept


def test_factory_prepares_the_network_once() -> None:
    # Prepare
    model, glob, clients, num_examples, x, y, rng = _setup("lenet", 4, 64)
    factory = CoalitionUtility(model, x, y, device="cpu")
    masks = _masks(4, 5, rng)
    # Execute
    first, second = factory(glob, clients, num_examples), factory(clients[0], clients,
                                                                  num_examples)
    fresh = CoalitionGame(model, clients[0], clients, num_examples, x, y, device="cpu")
    # Assert
    assert first._net is second._net and first._x is second._x
    np.testing.assert_array_equal(second(masks), fresh(masks))


def test_empty_coalition_is_global_model_and_cache_counts_distinct() -> None:
    # Prepare
    model, glob, clients, num_examples, x, y, _ = _setup("lenet", 4, 32)
    utility = CoalitionGame(model, glob, clients, num_examples, x, y, metric="neg-loss")
    empty = np.zeros((1, 4), bool)
    only_global = naive_utility(model, glob, [glob], [1], x, y, np.ones((1, 1), bool), "neg-loss")
    # Execute
    first = utility(np.concatenate([empty, empty, np.eye(4, dtype=bool)]))
    second = utility(np.eye(4, dtype=bool)[::-1])
    # Assert
    np.testing.assert_allclose(first[:2], only_global[0], atol=1e-5)
    np.testing.assert_array_equal(second, first[2:][::-1])
    assert utility.n_model_evals == 5  # empty + 4 singletons, each once


def test_coefficients_rows_sum_to_one() -> None:
    masks = np.array([[True, False, True], [False, False, False]])
    coef = coalition_coefficients(masks, [10, 20, 30])
    np.testing.assert_allclose(coef, [[0.25, 0.0, 0.75, 0.0], [0.0, 0.0, 0.0, 1.0]])


def test_validation_errors_name_the_value() -> None:
    model, glob, clients, num_examples, x, y, _ = _setup("lenet", 2, 8)
    with pytest.raises(ValueError, match=r"num_examples\[1\] = 0"):
        CoalitionGame(model, glob, clients, [5, 0], x, y)
    bad = dict(clients[1], **{"fc3.bias": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"client_states\[1\]\['fc3.bias'\] has shape \(3,\)"):
        CoalitionGame(model, glob, [clients[0], bad], num_examples, x, y)
    missing = {k: v for k, v in clients[0].items() if k != "stem.bias"}
    with pytest.raises(ValueError, match=r"client_states\[0\] keys differ.*stem.bias"):
        CoalitionGame(model, glob, [missing, clients[1]], num_examples, x, y)
    utility = CoalitionGame(model, glob, clients, num_examples, x, y)
    with pytest.raises(ValueError, match="numpy bool array, got int64"):
        utility(np.ones((1, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"shape \(k, 2\) for 2 clients, got \(1, 3\)"):
        utility(np.ones((1, 3), dtype=bool))
    with pytest.raises(ValueError, match="metric 'f1'"):
        CoalitionGame(model, glob, clients, num_examples, x, y, metric="f1")
