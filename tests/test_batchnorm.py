"""BatchNorm networks through the whole round: buffers round-trip, follow the stated rule
(fedowen_strategy.updates), are valued without being differentiated, and resume; the user's
own ``module:factory`` model; the ``device`` key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from client_app.app import app as client_app
from fedowen_strategy.defences.bounds import clip_state
from fedowen_strategy.replies import _check_state, record_to_state, state_to_record
from fedowen_strategy.round.aggregation import weighted_average
from fedowen_strategy.torch_utility.batched import CoalitionGame
from fedowen_strategy.updates import average_buffers, restore_counters, update_keys, update_norm
from fedowen_task.models import build_model, check_model_input, state_to_numpy
from server_app.app import run
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid

USER_MODEL = "tests.user_models:tiny_bn"


def bn_state(mean: float, var: float, count: int) -> dict[str, np.ndarray]:
    """A BatchNorm layer's state: weight, running statistics and the 0-d step counter."""
    return {"weight": np.full(2, mean, np.float32), "running_mean": np.full(2, mean, np.float32),
            "running_var": np.full(2, var, np.float32),
            "num_batches_tracked": np.array(count, np.int64)}


def test_aggregated_buffers_follow_the_rule() -> None:
    # Prepare: three clients, weights 0.5 / 0.3 / 0.2
    states = [bn_state(1.0, 2.0, 10), bn_state(3.0, 4.0, 20), bn_state(5.0, 6.0, 31)]
    weights = np.array([0.5, 0.3, 0.2])
    # Execute
    out = weighted_average(states, weights)
    # Assert: running statistics averaged as parameters are (0.5 + 0.9 + 1.0 = 2.4), the
    # counter the same average rounded (5 + 6 + 6.2 = 17.2 -> 17), dtype and 0-d shape kept
    np.testing.assert_allclose(out["running_mean"], [2.4, 2.4], rtol=1e-6)
    np.testing.assert_allclose(out["running_var"], [3.4, 3.4], rtol=1e-6)
    assert out["num_batches_tracked"].shape == () and out["num_batches_tracked"].dtype == np.int64
    assert int(out["num_batches_tracked"]) == 17
    assert isinstance(out["num_batches_tracked"], np.ndarray)
    # the peers' form: weights that need not sum to 1 are normalised (2:1 -> 13.33 -> 13);
    # only buffers come back (the parameters are the peer's own combination)
    peer = average_buffers(states[:2], np.array([2.0, 1.0]), states[0])
    assert sorted(peer) == ["num_batches_tracked", "running_mean", "running_var"]
    assert int(peer["num_batches_tracked"]) == 13
    np.testing.assert_allclose(peer["running_mean"], [5 / 3, 5 / 3], rtol=1e-6)
    # nobody weighted: the global model's counter stays
    assert int(average_buffers(states[:2], np.zeros(2), states[2])["num_batches_tracked"]) == 31


def test_statistics_are_averaged_but_are_not_part_of_the_update() -> None:
    # Prepare: a client whose statistics moved far (as ResNet-18's do in its first epoch)
    # and whose weight moved by 0.5 per entry
    glob, client = bn_state(1.0, 1.0, 0), bn_state(1.5, 400.0, 10)
    # Execute / Assert: the update is the weight alone; norms and the norm check ignore the
    # statistics (a max-norm-ratio of 1 passes a weight step of norm 0.71 < 1.41)
    assert update_keys(glob) == ["weight"]
    assert update_norm(client, glob) == pytest.approx(np.sqrt(2 * 0.25))
    assert _check_state(client, glob, max_norm_ratio=1.0) is None
    # a clip scales the weight's step and leaves the statistics as the client sent them
    clipped = clip_state(client, glob, 0.5)
    np.testing.assert_allclose(clipped["weight"], [1.25, 1.25])
    np.testing.assert_allclose(clipped["running_var"], [400.0, 400.0])


def test_a_negative_running_variance_is_rejected_by_name() -> None:
    # Prepare: a reply whose running variance went below 0 (noise added to every float
    # array, as the simulated noise attacker does), and one at exactly 0
    glob = bn_state(1.0, 1.0, 0)
    bad, zero = bn_state(1.0, 1.0, 0), bn_state(1.0, 0.0, 0)
    bad["running_var"] = np.array([0.5, -0.25], np.float32)
    # Execute / Assert
    assert _check_state(bad, glob, max_norm_ratio=0.0) == (
        "array 'running_var' holds a negative variance (-0.25): a normalisation layer's "
        "running variance is never below 0")
    assert _check_state(zero, glob, max_norm_ratio=0.0) is None


def test_zero_d_arrays_round_trip_through_the_array_record() -> None:
    # Prepare: the aggregate of a round, as weighted_average returns it
    state = weighted_average([bn_state(1.0, 1.0, 4), bn_state(1.0, 1.0, 6)], np.array([.5, .5]))
    # Execute
    back = record_to_state(state_to_record(state))
    # Assert: the counter is 0-d after the trip (it came back as [1] and every later reply was
    # rejected as "int64[], expected int64[1]")
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in state.items()}
    assert back["num_batches_tracked"].shape == () and int(back["num_batches_tracked"]) == 5


def test_flower_aggregate_gets_its_counters_back() -> None:
    # Flower's aggregate_arrayrecords multiplies every array by a float weight
    flower = {"running_mean": np.ones(2, np.float32), "num_batches_tracked": np.array(16.6)}
    out = restore_counters(flower, bn_state(0.0, 1.0, 0))
    assert out["num_batches_tracked"].dtype == np.int64 and out["num_batches_tracked"].shape == ()
    assert int(out["num_batches_tracked"]) == 17
    assert out["running_mean"].dtype == np.float32


def test_first_order_ranks_a_helpful_update_above_a_harmful_one() -> None:
    # Prepare: a BatchNorm network; the helpful update is 20 SGD steps on the evaluation set
    # (buffers moved by training too), the harmful one its negative
    torch.manual_seed(0)
    x = torch.randn(64, 1, 8, 8)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()
    model = build_model(USER_MODEL, 1, 2, seed=0)
    glob = state_to_numpy(model)
    trained = build_model(USER_MODEL, 1, 2, seed=0)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.5)
    for _ in range(20):
        optimizer.zero_grad()
        F.cross_entropy(trained(x), y).backward()
        optimizer.step()
    helpful = state_to_numpy(trained)
    harmful = {k: (2 * glob[k] - v if np.issubdtype(v.dtype, np.floating) else v)
               for k, v in helpful.items()}
    harmful["1.running_var"] = np.abs(harmful["1.running_var"])  # a variance stays >= 0
    game = CoalitionGame(model, glob, [helpful, harmful], [1, 1], x, y, metric="neg-loss",
                         device="cpu", shares=[0.5, 0.5])
    # Execute: buffers are constants of the forward, not differentiated (this raised
    # "native_batch_norm is not differentiable with respect to argument 'running_mean'")
    terms = game.first_order(0.5)
    # Assert
    assert np.all(np.isfinite(terms)) and terms[0] > 0 > terms[1], terms


def small_config(data: Path, out: Path, **extra: Any) -> dict[str, Any]:
    return {"dataset": "mnist", "data-dir": str(data), "output-dir": str(out),
            "num-server-rounds": 3, "clients-per-round": 3, "client-max-samples": 60,
            "test-max-samples": 200, "eval-fraction": 0.002, "alpha": 10.0,
            "imbalance-factor": 1.0, **extra}


def run_in_process(config: dict[str, Any], out: Path, partitions: int = 4) -> list[dict]:
    nodes = [{"partition-id": i, "num-partitions": partitions} for i in range(partitions)]
    run(InProcessGrid(client_app, nodes, config), parse_run_config(config), out)
    return read_rounds(out)


@pytest.mark.parametrize(("model", "dataset", "extra"), [
    (USER_MODEL, "mnist", {}),
    (USER_MODEL, "mnist", {"strategy": "fedavgm"}),
    (USER_MODEL, "mnist", {"strategy": "fltrust"}),
    ("cnn", "cifar10", {}),
    # ResNet-18 (11M parameters) on the CPU: first-order keeps the valuation to one gradient
    ("resnet18", "mnist", {"valuation": "first-order", "client-max-samples": 20,
                           "clients-per-round": 2, "test-max-samples": 50,
                           "eval-fraction": 0.0005}),
])
def test_every_model_trains_three_rounds_with_no_reply_rejected(
        model: str, dataset: str, extra: dict[str, Any], shared_data_dir: Path,
        tmp_path: Path) -> None:
    # Prepare
    config = small_config(shared_data_dir, tmp_path, model=model, dataset=dataset, **extra)
    # Execute
    rounds = run_in_process(config, tmp_path)
    # Assert: every round aggregated every reply; the final model's counters stay 0-d ints
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    k = config["clients-per-round"]
    assert all(not r["rejected"] and not r["failed"] and len(r["returned"]) == k
               for r in rounds[1:]), [r["rejected"] for r in rounds]
    assert all(np.isfinite(r["test_loss"]) for r in rounds)
    final = torch.load(tmp_path / "final_model.pt")
    reference = build_model(model, 3 if dataset == "cifar10" else 1, 10).state_dict()
    assert {k: (v.shape, v.dtype) for k, v in final.items()} == \
        {k: (v.shape, v.dtype) for k, v in reference.items()}
    if model == USER_MODEL:  # it learns (the others at these sizes are checked elsewhere)
        assert rounds[3]["test_loss"] < rounds[0]["test_loss"]


def test_a_checkpoint_with_buffers_resumes_to_the_uninterrupted_run(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: 3 rounds straight; 2 rounds, then resumed to 3
    straight = small_config(shared_data_dir, tmp_path / "a", model=USER_MODEL)
    run_in_process(straight, tmp_path / "a")
    first = small_config(shared_data_dir, tmp_path / "b", model=USER_MODEL,
                         **{"num-server-rounds": 2})
    run_in_process(first, tmp_path / "b")
    # Execute
    resumed = {**first, "num-server-rounds": 3, "resume-from": str(tmp_path / "b")}
    run_in_process(resumed, tmp_path / "b")
    # Assert: the same rounds and the same final state, buffers included
    a, b = read_rounds(tmp_path / "a"), read_rounds(tmp_path / "b")
    assert [r["weights"] for r in a[1:]] == [r["weights"] for r in b[1:]]
    model_a, model_b = (torch.load(tmp_path / d / "final_model.pt") for d in ("a", "b"))
    assert any("running_var" in k for k in model_a)
    for key, value in model_a.items():
        torch.testing.assert_close(model_b[key], value, rtol=0, atol=0)


@pytest.mark.parametrize(("model", "message"), [
    ("tests.user_models:missing", "cannot import it"),
    ("no_such_package.models:net", "cannot import it"),
    ("tests.user_models:not_a_module", "not a torch.nn.Module"),
    ("resnet", "is not one of"),
])
def test_a_model_that_cannot_be_built_names_the_key(model: str, message: str) -> None:
    with pytest.raises(ValueError, match="model=") as err:
        build_model(model, 1, 10)
    assert message in str(err.value)


def test_a_model_that_does_not_fit_the_data_names_the_key() -> None:
    # a network for 3 classes on a 10-class dataset; LeNet's 32x32 twin on 28x28 images
    x = torch.zeros(4, 1, 28, 28)
    with pytest.raises(ValueError, match=r"model='tests.user_models:wrong_classes' returned "
                                         r"\[2, 3\].*expected logits \[2, 10\]"):
        check_model_input(build_model("tests.user_models:wrong_classes", 1, 10),
                          "tests.user_models:wrong_classes", x, 10)
    with pytest.raises(ValueError, match="model='cnn' cannot run on the dataset's input"):
        check_model_input(build_model("cnn", 1, 10), "cnn", x, 10)


def test_run_config_checks_model_and_device_before_any_round() -> None:
    assert parse_run_config({"model": USER_MODEL}).model_name() == USER_MODEL
    with pytest.raises(ValueError, match=r"model='tests\.user_models:nope'"):
        parse_run_config({"model": "tests.user_models:nope"})
    with pytest.raises(ValueError, match="device='gpu' is not one of auto, cpu, cuda"):
        parse_run_config({"device": "gpu"})
    if not torch.cuda.is_available():  # a machine without a GPU refuses cuda at start
        with pytest.raises(ValueError, match="device='cuda': torch sees no CUDA device"):
            parse_run_config({"device": "cuda"})


def test_virtual_clients_get_a_share_of_a_gpu_through_flowers_option() -> None:
    from fedowen_deploy.launcher import federation_config

    assert federation_config(100, 1.0) == "num-supernodes=100 client-resources-num-cpus=1"
    assert federation_config(100, 1.0, 0.1) == (
        "num-supernodes=100 client-resources-num-cpus=1 client-resources-num-gpus=0.1")
    with pytest.raises(ValueError, match="gpus-per-client=-1"):
        federation_config(100, 1.0, -1)
