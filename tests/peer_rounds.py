"""Hand-built rounds the peers' defence tests share (tests/test_backdoor_peers.py,
tests/test_flame.py): a 4-coordinate model, a reply message carrying ``GLOBAL + delta``, and
one round of Flower's FedAvg wrapped in a defence list."""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedowen_strategy.defences.defended import Defended
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.replies import record_to_state, state_to_record
from sim.inline_grid import InProcessGrid

GLOBAL = {"w": np.ones(4, np.float32)}
BASE = np.array([0.1, 0.2, 0.3, 0.4], np.float32)  # norm sqrt(0.3)


def reply(delta: np.ndarray, cid: str, node: int) -> Message:
    """Node ``node``'s train reply as client ``cid``: ``GLOBAL + delta`` on 10 examples."""
    request = Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=node)
    content = RecordDict({"arrays": state_to_record({"w": GLOBAL["w"] + delta}),
                          "metrics": MetricRecord({"num-examples": 10}),
                          "client": ConfigRecord({"client-id": cid})})
    return Message(content, reply_to=request)


def around_fedavg(defences: str, guards: Guards, deltas: list[np.ndarray], seed: int = 0
                  ) -> tuple[Defended, np.ndarray]:
    """FedAvg wrapped in ``defences`` after one round over ``deltas``, and its aggregate."""
    wrapped = Defended(FedAvg(fraction_train=1.0), defences, guards, seed=seed)
    grid = InProcessGrid(lambda m, c: Message(RecordDict(), reply_to=m),
                         [{"partition-id": i} for i in range(len(deltas))])
    list(wrapped.configure_train(1, state_to_record(GLOBAL), ConfigRecord(), grid))
    arrays, _ = wrapped.aggregate_train(1, [reply(d, f"c{i + 1}", i + 1)
                                            for i, d in enumerate(deltas)])
    assert arrays is not None
    return wrapped, record_to_state(arrays)["w"]
