"""Flower's strategies weight clients by sample count by default, and equally with
``strategy-params = "weighted_by_key=unit-weight"`` (the metric every train reply carries)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedowen_strategy.replies import record_to_state, state_to_record
from fedowen_task.protocol import UNIT_WEIGHT_FIELD
from server_app.config import parse_run_config
from server_app.strategies import build_flower_strategy
from sim.inline_grid import InProcessGrid


def handler(msg: Message, ctx: Context) -> Message:
    """Client i sends the model w = i with 10 (i + 1) examples."""
    pid = int(ctx.node_config["partition-id"])
    state = {"w": np.full(3, float(pid), np.float32)}
    metrics = MetricRecord({"num-examples": 10 * (pid + 1), "train-loss": 1.0,
                            UNIT_WEIGHT_FIELD: 1})
    return Message(RecordDict({"arrays": state_to_record(state), "metrics": metrics}),
                   reply_to=msg)


def one_round(strategy_params: str) -> np.ndarray:
    cfg = parse_run_config({"strategy": "fedavg", "clients-per-round": 4,
                            "strategy-params": strategy_params})
    strategy = build_flower_strategy(cfg, 4, None)
    result = strategy.start(grid=InProcessGrid(handler, [{"partition-id": i} for i in range(4)]),
                            initial_arrays=state_to_record({"w": np.zeros(3, np.float32)}),
                            num_rounds=1)
    arrays: Any = result.arrays
    assert isinstance(arrays, ArrayRecord)
    return record_to_state(arrays)["w"]


@pytest.mark.parametrize(("params", "expected"), [
    ("", (0 * 10 + 1 * 20 + 2 * 30 + 3 * 40) / 100),   # sample counts: 2.0
    ("weighted_by_key=unit-weight", (0 + 1 + 2 + 3) / 4),  # equal: 1.5
])
def test_sample_count_and_equal_weights(params: str, expected: float) -> None:
    np.testing.assert_allclose(one_round(params), np.full(3, expected), rtol=1e-6)
