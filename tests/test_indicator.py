"""BackdoorIndicator as a defence (issue 72, deliver 2; :mod:`fedowen_strategy.defences.
indicator`): the dispatch hook that plants the indicator in the model sent, the flag on
hand-built rounds (in FedOwen and around Flower's FedAvg), the torch task on a tiny model, the
ServerApp's out-of-distribution samples, and the errors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from numpy.typing import NDArray
from torch import nn

from fedowen_strategy.defences import table
from fedowen_strategy.defences.base import Dispatching, GuardedRound, RoundView, dispatch_model
from fedowen_strategy.defences.defended import Defended
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.indicator import (
    Indicator,
    checked_model,
    sent_model,
    strongest,
)
from fedowen_strategy.defences.indicator_task import TorchIndicator
from fedowen_strategy.replies import ClientUpdate, record_to_state, state_to_record
from fedowen_strategy.round.contribution import ValuationSettings
from fedowen_strategy.strategy import FedOwen
from fedowen_task.data import DatasetArrays
from server_app.config import parse_run_config
from server_app.indicator import fitted, indicator_guard, indicator_samples, ood_dataset
from sim.inline_grid import InProcessGrid

#: The global model: three weights, a BatchNorm statistic and its counter.
GLOBAL: dict[str, NDArray] = {"w": np.zeros(3, np.float32),
                              "bn.running_mean": np.ones(3, np.float32),
                              "bn.num_batches_tracked": np.array(0, np.int64)}
PLANTED_W = np.array([0.25, 1.0, 0.0], np.float32)


class ToyTask:
    """Label l's accuracy is ``w[l] x running_mean[l] / 4``, clipped to [0, 1]; the planting
    sets ``w`` to :data:`PLANTED_W` and the statistic to 4 (so a model is scored at ``w`` only
    with the planted statistic) and counts 5 steps."""

    def __init__(self) -> None:
        self.rounds: list[int] = []

    def plant(self, state: Mapping[str, NDArray], server_round: int, guards: Guards
              ) -> dict[str, NDArray]:
        self.rounds.append(server_round)
        return {**state, "w": PLANTED_W.copy(), "bn.running_mean": np.full(3, 4.0, np.float32),
                "bn.num_batches_tracked": np.array(5, np.int64)}

    def label_accuracy(self, state: Mapping[str, NDArray]) -> dict[int, float]:
        w, mean = state["w"], state["bn.running_mean"]
        return {lab: float(np.clip(w[lab] * mean[lab] / 4, 0, 1)) for lab in range(3)}


def reply(w: list[float], cid: str, node: int, received: Mapping[str, NDArray]) -> Message:
    """Client ``cid`` returns ``received`` with weights ``w`` (its statistic as received)."""
    request = Message(RecordDict(), message_type="train", dst_node_id=node)
    content = RecordDict({"arrays": state_to_record({**received, "w": np.asarray(w, np.float32)}),
                          "metrics": MetricRecord({"num-examples": 10}),
                          "client": ConfigRecord({"client-id": cid})})
    return Message(content, reply_to=request)


def test_the_models_sent_and_checked_and_the_strongest_label_by_hand() -> None:
    # Prepare: the planting moved the weights, the statistic and the counter
    planted = ToyTask().plant(GLOBAL, 1, Guards())
    update: dict[str, NDArray] = {"w": np.full(3, 7, np.float32),
                                  "bn.running_mean": np.full(3, 9, np.float32),
                                  "bn.num_batches_tracked": np.array(8, np.int64)}
    # Execute
    sent = sent_model(GLOBAL, planted)
    checked = checked_model(update, {k: planted[k] for k in ("bn.running_mean",
                                                              "bn.num_batches_tracked")})
    # Assert: sent = planted weights, the statistics from before (replace_original_bn);
    # checked = the update's weights, the planted statistics; ties go to the lowest label
    assert list(sent) == list(GLOBAL)
    np.testing.assert_array_equal(sent["w"], PLANTED_W)
    np.testing.assert_array_equal(sent["bn.running_mean"], GLOBAL["bn.running_mean"])
    assert sent["bn.num_batches_tracked"] == 0
    np.testing.assert_array_equal(checked["w"], [7, 7, 7])
    np.testing.assert_array_equal(checked["bn.running_mean"], [4, 4, 4])
    assert checked["bn.num_batches_tracked"] == 5
    assert strongest({0: 0.5, 1: 0.9, 2: 0.9}) == (1, 0.9)


def test_a_list_without_a_dispatch_step_sends_the_very_record() -> None:
    # Prepare
    arrays = state_to_record(GLOBAL)
    # Execute
    sent = dispatch_model(table.build("auto", fedowen=True), arrays, Dispatching(1))
    planted = dispatch_model([Indicator(ToyTask())], arrays, Dispatching(1))
    # Assert: the default list leaves the record itself (pinned runs send what they sent)
    assert sent is arrays
    assert planted is not arrays
    np.testing.assert_array_equal(record_to_state(planted)["w"], PLANTED_W)


def test_an_update_that_keeps_the_indicator_is_flagged_one_that_forgets_it_is_not() -> None:
    # Prepare: planted round 3; threshold 0.75
    guard, guards = Indicator(ToyTask()), Guards(indicator_threshold=0.75)
    sent = guard.dispatch(dict(GLOBAL), Dispatching(3, guards))
    keeps = ClientUpdate(1, "c1", dict(sent), 10, 0.0)  # the planted weights unchanged
    at = ClientUpdate(2, "c2", {**sent, "w": np.array([0, 0.75, 0], np.float32)}, 10, 0.0)
    forgets = ClientUpdate(3, "c3", {**sent, "w": np.array([0.5, 0.25, 0.125], np.float32)},
                           10, 0.0)
    # Execute
    out = guard.screen(GuardedRound([keeps, at, forgets]), RoundView(sent, guards,
                                                                      server_round=3))
    # Assert: scored with the planted statistic 4 (not the sent 1): c1 1.0 on label 1, c2 0.75
    # (at the threshold: flagged, the public code's >=), c3 0.5 on label 0, kept
    assert [u.client_id for u in out.updates] == ["c3"]
    assert sorted(out.rejected) == ["c1", "c2"]
    assert "accuracy 1 on the indicator samples of label 1 >= indicator-threshold 0.75" in (
        out.rejected["c1"])
    record = out.record["indicator"]
    assert record["accuracy"] == {"c1": 1.0, "c2": 0.75, "c3": 0.5}
    assert record["labels"] == {"c1": 1, "c2": 1, "c3": 0}
    # the planting: before 0 (label 0 first of the ties), after 1.0 on label 1, norm |PLANTED_W|
    assert (record["before"], record["label_before"], record["planted"], record["label"]) == (
        0.0, 0, 1.0, 1)
    assert (record["before_mean"], record["planted_mean"]) == (0.0, pytest.approx(1.25 / 3))
    assert record["norm"] == pytest.approx(np.sqrt(0.25 ** 2 + 1.0))


def test_around_flowers_fedavg_the_planted_model_is_sent_and_the_rest_averaged() -> None:
    # Prepare: FedAvg wrapped in the indicator; three nodes
    task = ToyTask()
    wrapped = Defended(FedAvg(fraction_train=1.0), [Indicator(task)],
                       Guards(indicator_threshold=0.75))
    grid = InProcessGrid(lambda m, c: Message(RecordDict(), reply_to=m),
                         [{"partition-id": i} for i in range(3)])
    # Execute
    messages = list(wrapped.configure_train(1, state_to_record(GLOBAL), ConfigRecord(), grid))
    sent = record_to_state(messages[0].content.array_records["arrays"])
    arrays, _ = wrapped.aggregate_train(1, [
        reply([0.25, 1.0, 0.0], "c1", 1000, sent), reply([0.5, 0.25, 0.0], "c2", 1001, sent),
        reply([0.0, 0.5, 0.25], "c3", 1002, sent)])
    # Assert: every message carries the planted weights and the old statistic; c1 kept the
    # indicator (rejected); FedAvg averages c2 and c3: (0.25, 0.375, 0.125)
    assert task.rounds == [1] and len(messages) == 3
    np.testing.assert_array_equal(sent["w"], PLANTED_W)
    np.testing.assert_array_equal(sent["bn.running_mean"], [1, 1, 1])
    assert list(wrapped.round_record["rejected"]) == ["c1"]
    assert arrays is not None
    np.testing.assert_allclose(record_to_state(arrays)["w"], [0.25, 0.375, 0.125])


def test_in_fedowen_the_clients_train_from_the_planted_model() -> None:
    # Prepare: clients 0..3; client 0 sends back what it got (keeps the indicator), the others
    # halve label 1's weight and move label 0's by their id (forget it)
    received: list[NDArray] = []

    def handler(msg: Message, ctx: Context) -> Message:
        pid = int(ctx.node_config["partition-id"])
        if msg.metadata.message_type == "query":
            return Message(RecordDict({"client": ConfigRecord({"client-id": f"c{pid}"})}),
                           reply_to=msg)
        state = record_to_state(msg.content.array_records["arrays"])
        received.append(state["w"].copy())
        moved = state["w"] * np.array([1, 0.5, 1], np.float32) + np.array([0.125 * pid, 0, 0],
                                                                           np.float32)
        w = state["w"] if pid == 0 else moved
        return Message(RecordDict({"arrays": state_to_record({**state, "w": w}),
                                   "metrics": MetricRecord({"num-examples": 10}),
                                   "client": ConfigRecord({"client-id": f"c{pid}"})}),
                       reply_to=msg)

    records: list[dict[str, Any]] = []
    strategy = FedOwen(clients_per_round=4, valuation=ValuationSettings(method="none"),
                       guards=Guards(indicator_threshold=0.75), defences=[Indicator(ToyTask())],
                       seed=1, on_round=lambda r, record, rows: records.append(record))
    # Execute
    result = strategy.start(grid=InProcessGrid(handler, [{"partition-id": i} for i in range(4)]),
                            initial_arrays=state_to_record(GLOBAL), num_rounds=1)
    # Assert: all four trained from the planted weights; c0 is rejected; the others
    # (0.375, 0.5, 0), (0.5, ...), (0.625, ...) average to (0.5, 0.5, 0)
    assert len(received) == 4 and all(np.array_equal(w, PLANTED_W) for w in received)
    assert list(records[0]["rejected"]) == ["c0"]
    assert records[0]["indicator"]["accuracy"] == {"c0": 1.0, "c1": 0.5, "c2": 0.5,
                                                   "c3": 0.625}
    final = record_to_state(result.arrays)
    np.testing.assert_allclose(final["w"], [0.5, 0.5, 0.0])


def test_planting_raises_the_indicator_accuracy_of_a_tiny_model() -> None:
    # Prepare: x = e_0, e_1, e_2 (twice), assigned labels 0, 1, 2; zero weights score every
    # sample as class 0 (argmax of equal logits)
    model = nn.Linear(3, 3)
    x = torch.eye(3).repeat(2, 1)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    zero = {k: np.zeros_like(v.detach().numpy()) for k, v in model.state_dict().items()}
    task = TorchIndicator(model, x, y, seed=0, batch_size=3)
    # Execute
    before = task.label_accuracy(zero)
    planted = task.plant(zero, 1, Guards(indicator_epochs=30, indicator_lr=0.5, indicator_mu=0))
    after = task.label_accuracy(planted)
    # Assert
    assert before == {0: 1.0, 1: 0.0, 2: 0.0}
    assert after == {0: 1.0, 1: 1.0, 2: 1.0}


def test_a_bound_torch_indicator_on_batchnorm_flags_the_kept_and_keeps_the_forgotten() -> None:
    # Prepare: BatchNorm then a linear layer; identity weights classify e_l as l
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 3, bias=False))
    init = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    guard = Indicator(TorchIndicator(model, torch.eye(3).repeat(2, 1),
                                     torch.tensor([0, 1, 2, 0, 1, 2]), batch_size=6))
    guards = Guards(indicator_epochs=20, indicator_lr=0.5, indicator_mu=0.0)
    # Execute
    sent = guard.dispatch(dict(init), Dispatching(1, guards))
    permuted = {**sent, "1.weight": np.roll(np.eye(3, dtype=np.float32), 1, axis=0),
                "0.weight": np.ones(3, np.float32), "0.bias": np.zeros(3, np.float32)}
    out = guard.screen(GuardedRound([ClientUpdate(1, "keeps", sent, 6, 0.0),
                                     ClientUpdate(2, "forgets", permuted, 6, 0.0)]),
                       RoundView(sent, guards, server_round=1))
    # Assert: the sent model keeps BatchNorm's statistics from before the planting; the guard
    # scores with the planted ones: 20 steps of momentum 0.1 from 0 towards the batch mean 1/3
    # of one-hot inputs, 1/3 x (1 - 0.9^20). The planted model scores 1.0; the permuted
    # weights map e_l to l + 1: every label 0
    assert guard.planted is not None
    np.testing.assert_array_equal(sent["0.running_mean"], init["0.running_mean"])
    assert int(sent["0.num_batches_tracked"]) == 0
    np.testing.assert_allclose(guard.planted.statistics["0.running_mean"],
                               [(1 - 0.9 ** 20) / 3] * 3, rtol=1e-5)
    assert int(guard.planted.statistics["0.num_batches_tracked"]) == 20
    assert list(out.rejected) == ["keeps"] and [u.client_id for u in out.updates] == ["forgets"]
    assert out.record["indicator"]["accuracy"] == {"keeps": 1.0, "forgets": 0.0}


def test_the_planting_is_reproducible_with_the_seed_and_leaves_torch_rng_alone() -> None:
    # Prepare: a model with dropout (the planting's one randomness)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    x, y = torch.eye(3).repeat(2, 1), torch.tensor([0, 1, 2, 0, 1, 2])
    guards = Guards(indicator_epochs=3, indicator_lr=0.1)
    rng = torch.get_rng_state()
    # Execute
    first = TorchIndicator(model, x, y, seed=7).plant(state, 2, guards)
    again = TorchIndicator(model, x, y, seed=7).plant(state, 2, guards)
    other = TorchIndicator(model, x, y, seed=7).plant(state, 3, guards)
    # Assert
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert not np.array_equal(first["0.weight"], other["0.weight"])
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_ood_samples_are_fitted_standardised_and_balanced() -> None:
    # Prepare: 130 Fashion-MNIST-like images of 1x2x2, pixel value = index mod 256; a task
    # of 3x4x4 images and 4 classes
    x = (np.arange(130, dtype=np.uint8)[:, None, None, None] * np.ones((1, 1, 2, 2), np.uint8))
    ood = DatasetArrays("fashion-mnist", x, np.zeros(130, np.int64), x[:1], np.zeros(1, np.int64),
                        10, 1)
    # Execute
    xs, ys = indicator_samples(ood, (3, 4, 4), 4, 130, seed=0, task_name="cifar10")
    again, labels = indicator_samples(ood, (3, 4, 4), 4, 130, seed=0, task_name="cifar10")
    # Assert: 128 kept (two batches of 64), 32 a label; black borders, the image in the
    # centre, standardised as Fashion-MNIST's ((v / 255 - 0.2860) / 0.3530), in all 3 channels
    assert xs.shape == (128, 3, 4, 4) and np.bincount(ys.numpy()).tolist() == [32] * 4
    assert torch.equal(xs, again) and torch.equal(ys, labels)
    border = -0.2860 / 0.3530
    assert torch.allclose(xs[:, :, 0, :], torch.full((128, 3, 4), border))
    centre = xs[:, 0, 1, 1]
    assert len(set(np.round(((centre.numpy() * 0.3530 + 0.2860) * 255), 3))) == 128
    assert torch.equal(xs[:, 0], xs[:, 2])


def test_the_pairings_and_every_error_name_the_value() -> None:
    # Prepare
    small = np.zeros((64, 3, 32, 32), np.uint8)
    ood = DatasetArrays("mnist", small[:, :1, :28, :28], np.zeros(64, np.int64),
                        small[:1, :1, :28, :28], np.zeros(1, np.int64), 10, 1)
    # Execute / Assert: auto's pairings
    assert [ood_dataset(d, "auto") for d in ("mnist", "fashion-mnist", "cifar10", "femnist",
                                             "medmnist")] == [
        "fashion-mnist", "mnist", "femnist", "fashion-mnist", "fashion-mnist"]
    with pytest.raises(ValueError, match=r"indicator-ood='cifar10' .3x32x32 images. cannot be "
                                         r"planted in a model of mnist's 1x28x28"):
        fitted(small, (1, 28, 28), ("cifar10", "mnist"))
    with pytest.raises(ValueError, match=r"indicator-samples=64 keeps 64 .* for 100 classes"):
        indicator_samples(ood, (1, 28, 28), 100, 64, 0, "mnist")
    with pytest.raises(ValueError, match="its samples are not out of distribution"):
        parse_run_config({"dataset": "mnist", "indicator-ood": "mnist"})
    with pytest.raises(ValueError, match="indicator-ood='fmnist': Unknown dataset"):
        parse_run_config({"indicator-ood": "fmnist"})
    with pytest.raises(ValueError, match=r"indicator-threshold=1\.5 must lie in"):
        parse_run_config({"indicator-threshold": 1.5})
    with pytest.raises(ValueError, match="has no indicator task"):
        Indicator().dispatch(dict(GLOBAL), Dispatching(1))
    with pytest.raises(RuntimeError, match="screens round 2 but planted nothing"):
        Indicator(ToyTask()).screen(GuardedRound([]), RoundView(GLOBAL, server_round=2))
    with pytest.raises(ValueError, match="got 6 samples and 5 labels"):
        TorchIndicator(nn.Linear(3, 3), torch.zeros(6, 3), torch.zeros(5))


def test_the_server_app_binds_the_guard_to_fashion_mnist_for_mnist(shared_data_dir: Path
                                                                    ) -> None:
    # Prepare: a model of MNIST's images and 10 classes
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))
    # Execute
    guard = indicator_guard(model, torch.zeros(2, 1, 28, 28), torch.device("cpu"),
                            dataset="mnist", ood="auto", samples=100, seed=0,
                            data_dir=str(shared_data_dir))
    # Assert: 64 samples (one whole batch of 64 of the 100), labels 0-3 seven times, 4-9 six
    task: Any = guard.task
    assert task.x.shape == (64, 1, 28, 28)
    assert np.bincount(task.y.numpy()).tolist() == [7] * 4 + [6] * 6
    assert table.DEFENCES["indicator"].keys == ("indicator-threshold", "indicator-epochs",
                                                "indicator-lr", "indicator-mu")
