"""A run that learns nothing says so (issue 59, point 4): the stall rule on hand-built round
records, Flower's strategies rejecting replies of another model, and in-process runs whose
clients' model differs from the server's stopping with the named error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message

from client_app.app import train_handler
from fedowen_strategy.replies import state_to_record
from fedowen_task.models import build_model
from server_app.app import run
from server_app.config import parse_run_config
from server_app.matched import mismatch
from server_app.stall import RunStalled, StallWatch, stall_reason
from server_app.store.checkpoint import load_checkpoint
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid

SHAPE = "array 'fc3.weight' is float32[62, 84], expected float32[10, 84]"
TIMEOUT = "no reply within round-timeout (timed out or disconnected)"


def rnd(number: int, returned: tuple[str, ...] = (), failed: dict[str, str] | None = None,
        rejected: dict[str, str] | None = None) -> dict[str, Any]:
    """A training round's record as rounds.jsonl holds it."""
    failed, rejected = failed or {}, rejected or {}
    return {"round": number, "selected": [*returned, *failed, *rejected],
            "returned": list(returned), "failed": failed, "rejected": rejected}


def test_every_reply_rejected_alike_stops_at_once_naming_reason_and_what_to_check() -> None:
    # Prepare
    rounds = [rnd(1, ("a", "b")), rnd(2, rejected={c: SHAPE for c in "abc"})]
    # Execute
    reason = stall_reason(rounds, 3)
    # Assert
    assert reason is not None
    assert reason.startswith(f"every reply of round 2 was rejected (3 replies, one reason): "
                             f"{SHAPE}; the clients' model does not match the server's")
    assert "`model`" in reason


def test_every_reply_failed_alike_stops_at_once() -> None:
    crash = "error 2: RuntimeError: CUDA out of memory"
    reason = stall_reason([rnd(1, failed={"a": crash, "b": crash})], 3)
    assert reason is not None and reason.startswith("every reply of round 1 failed")
    assert "the ClientApp raised on every node" in reason


def test_nodes_that_sent_no_reply_are_not_replies() -> None:
    # 8 alike rejections and 2 silent nodes: every reply that came said the same
    rounds = [rnd(4, failed={"x": TIMEOUT, "y": "no reply"},
                  rejected={str(i): SHAPE for i in range(8)})]
    assert stall_reason(rounds, 3) is not None
    # every node silent (FedOwen's and Recorded's wording, the SuperLink's): only the count
    unavailable = "Error: Node Unavailable - The destination node failed to report a heartbeat"
    silent = [rnd(r, failed={"x": TIMEOUT, "y": "no reply", "z": unavailable})
              for r in (1, 2)]
    assert stall_reason(silent, 3) is None
    assert stall_reason(silent, 2) is not None


def test_one_reply_is_not_every_reply_and_different_reasons_only_count() -> None:
    # Prepare: a single rejected reply; then rounds whose rejections differ (norms)
    one = [rnd(1, rejected={"a": SHAPE})]
    differ = [rnd(r, rejected={"a": f"update norm {r}.1 exceeds 10 x the global model's norm",
                               "b": f"update norm {r}.7 exceeds 10 x the global model's norm"})
              for r in (1, 2, 3)]
    # Execute / Assert
    assert stall_reason(one, 3) is None
    assert stall_reason(differ[:2], 3) is None
    reason = stall_reason(differ, 3)
    assert reason is not None
    assert reason.startswith("no update was accepted in 3 rounds in a row (rounds 1-3, "
                             "max-stalled-rounds = 3); round 3: 2 rejected (update norm 3.1")
    assert "and 1 other reason(s)" in reason and "`max-norm-ratio`" in reason
    # a diverged run (archived cells stopped so: NaN in every reply, one array or another)
    nan = [rnd(r, rejected={"a": "array 'fc1.weight' holds NaN or Inf",
                            "b": "array 'conv1.weight' holds NaN or Inf"}) for r in (1, 2, 3)]
    assert "local training diverged: lower `lr`" in str(stall_reason(nan, 3))


def test_a_round_that_accepted_anything_is_not_stalled_and_resets_the_count() -> None:
    # some clients time out or are rejected, others are accepted: a normal round
    partial = rnd(3, ("c", "d"), failed={"a": TIMEOUT, "b": TIMEOUT}, rejected={"e": SHAPE})
    assert stall_reason([partial], 1) is None
    stalled = [rnd(1, failed={"a": TIMEOUT}), rnd(2, failed={"a": TIMEOUT}), partial,
               rnd(4, failed={"a": TIMEOUT}), rnd(5, failed={"a": TIMEOUT})]
    assert stall_reason(stalled, 3) is None
    assert stall_reason(stalled[:2], 2) is not None


def test_zero_never_stops_and_one_stops_at_the_first_empty_round() -> None:
    alike = [rnd(r, rejected={c: SHAPE for c in "ab"}) for r in range(1, 6)]
    assert stall_reason(alike, 0) is None
    assert stall_reason([rnd(1, failed={"a": TIMEOUT})], 1) is not None


def test_watch_ignores_the_initial_evaluation_and_names_where_the_records_are() -> None:
    # Prepare
    watch = StallWatch(2, "/runs/x")
    # Execute
    watch.observe({"round": 0, "test_accuracy": 0.1})
    watch.observe(rnd(1, failed={"a": TIMEOUT}))
    with pytest.raises(RunStalled, match=r"rounds 1-2.*Records up to this round are in /runs/x"):
        watch.observe(rnd(2, failed={"a": TIMEOUT}))
    # Assert: with 0 it only watches
    quiet = StallWatch(0)
    for r in range(1, 5):
        quiet.observe(rnd(r, rejected={c: SHAPE for c in "ab"}))


def test_flower_side_mismatch_compares_names_and_shapes_not_dtypes() -> None:
    ref = state_to_record({"w": np.zeros((10, 84), np.float32), "n": np.zeros((), np.int64)})
    assert mismatch(state_to_record({"w": np.ones((10, 84), np.float32),
                                     "n": np.zeros((), np.float64)}), ref) is None
    assert mismatch(state_to_record({"w": np.ones((62, 84), np.float32),
                                     "n": np.zeros((), np.int64)}), ref) == (
        "array 'w' is float32[62, 84], expected float32[10, 84]")
    assert mismatch(state_to_record({"w": np.ones((10, 84), np.float32)}), ref) == (
        "array keys differ from the global model (missing ['n'], extra [])")


def _config(data: Path, out: Path, **extra: Any) -> dict[str, Any]:
    return {"dataset": "mnist", "data-dir": str(data), "output-dir": str(out),
            "num-server-rounds": 5, "clients-per-round": 3, "client-max-samples": 60,
            "test-max-samples": 200, "alpha": 10.0, "imbalance-factor": 1.0, **extra}


def _run(config: dict[str, Any], handler: Any = train_handler,
         client_config: dict[str, Any] | None = None) -> None:
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    cfg = parse_run_config(config)
    run(InProcessGrid(handler, nodes, client_config or config), cfg, cfg.resolved_output_dir(1))


def other_model(msg: Message, context: Context) -> Message:
    """The real ClientApp, whose reply carries a LeNet for 62 classes (FEMNIST's)."""
    reply = train_handler(msg, context)
    reply.content["arrays"] = ArrayRecord(build_model("lenet", 1, 62).state_dict())
    return reply


@pytest.mark.parametrize("strategy", ["fedowen", "fedavg"])
def test_clients_sending_another_model_stop_the_run_in_round_one(
        strategy: str, shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare
    config = _config(shared_data_dir, tmp_path, strategy=strategy, model="lenet")
    # Execute
    with pytest.raises(RunStalled) as stop:
        _run(config, other_model)
    # Assert: the named reason and what to check; round 1 recorded and checkpointed first
    message = str(stop.value)
    assert "every reply of round 1 was rejected (3 replies, one reason): array 'fc3.weight' " \
           "is float32[62, 84], expected float32[10, 84]" in message
    assert "the clients' model does not match the server's" in message
    rounds = read_rounds(tmp_path)
    assert [r["round"] for r in rounds] == [0, 1] and len(rounds[1]["rejected"]) == 3
    assert load_checkpoint(str(tmp_path)).server_round == 1


def test_clients_built_with_another_model_fail_alike_and_stop_the_run(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: the ServerApp runs LeNet, the ClientApps build the small CNN
    config = _config(shared_data_dir, tmp_path, model="lenet")
    # Execute
    with pytest.raises(RunStalled, match=r"every reply of round 1 failed \(3 replies.*"
                                         r"the clients' model does not match the server's"):
        _run(config, client_config={**config, "model": "cnn"})
    # Assert
    assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1]


def test_rounds_without_an_accepted_update_stop_after_max_stalled_rounds(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: a norm guard nobody passes; each client's norm differs, so no reason is shared
    config = _config(shared_data_dir, tmp_path, **{"max-norm-ratio": 1e-6,
                                                   "max-stalled-rounds": 2})
    # Execute
    with pytest.raises(RunStalled, match=r"no update was accepted in 2 rounds in a row "
                                         r"\(rounds 1-2, max-stalled-rounds = 2\)"):
        _run(config)
    # Assert
    assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1, 2]
    assert load_checkpoint(str(tmp_path)).server_round == 2


def test_flower_strategy_whose_nodes_never_answer_stops_after_max_stalled_rounds(
        shared_data_dir: Path, tmp_path: Path) -> None:
    def silent(msg: Message, context: Context) -> Message:
        raise TimeoutError  # the in-process grid's node that never answers

    config = _config(shared_data_dir, tmp_path, strategy="fedavg",
                     **{"max-stalled-rounds": 2, "node-wait-timeout": 1.0})
    with pytest.raises(RunStalled, match=r"rounds 1-2.*3 failed \(no reply\)"):
        _run(config, silent)


def test_one_client_of_another_model_is_rejected_and_the_round_goes_on(
        shared_data_dir: Path, tmp_path: Path) -> None:
    def one_other(msg: Message, context: Context) -> Message:
        first = context.node_config["partition-id"] == 0
        return other_model(msg, context) if first else train_handler(msg, context)

    # Prepare: all 4 nodes a round, so partition 0's reply is in every round
    config = _config(shared_data_dir, tmp_path, strategy="fedavg",
                     **{"num-server-rounds": 2, "clients-per-round": 4})
    # Execute
    _run(config, one_other)
    # Assert: Flower's FedAvg averaged the other three, every round
    rounds = read_rounds(tmp_path)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for record in rounds[1:]:
        assert list(record["rejected"]) == ["0"] and len(record["returned"]) == 3
        assert "expected float32[10, 84]" in record["rejected"]["0"]
