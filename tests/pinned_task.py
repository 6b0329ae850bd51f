"""The closed-form task of tests/test_selections_pinned.py (no torch): 20 clients whose
updates pull a vector ``w`` toward their own targets (two push it away, one returns the model
unchanged, four Sybils send near-parallel updates, one copies client 0), the server's utility
of a coalition (minus the squared distance of its example-weighted average to the common
target) and, for the selectors that read one (HiCS-FL, hics-phi), an output layer beside
``w`` whose bias each client moves toward its own label distribution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedowen_strategy.replies import record_to_state, state_to_record
from fedowen_task.protocol import LOCAL_LOSS_FIELD, LOSS_SQUARES_FIELD, STEP_SCALE_FIELD

CLIENTS, DIM = 20, 16
BAD, FREE_RIDER, SYBILS, COPIER = (12, 13), 11, (14, 15, 16, 17), 19
#: Each client's target: a common one plus its own offset (fixed, not drawn at run time).
_TABLE = np.random.default_rng(2024)
COMMON = _TABLE.normal(size=DIM)
TARGETS = COMMON + 0.8 * _TABLE.normal(size=(CLIENTS, DIM))
TARGETS[list(SYBILS)] = TARGETS[SYBILS[0]]
EXAMPLES = 20 + _TABLE.integers(0, 80, size=CLIENTS)
#: Each client's label distribution over CLASSES (its own generator: the table above stays).
CLASSES = 4
LABELS = np.random.default_rng(2025).dirichlet(np.full(CLASSES, 0.3), size=CLIENTS)
LABELS[list(SYBILS)] = LABELS[SYBILS[0]]

def step(pid: int, w: np.ndarray, server_round: int) -> np.ndarray:
    """Client ``pid``'s new model from ``w`` in ``server_round`` (deterministic)."""
    if pid == COPIER:
        return step(0, w, server_round)
    if pid == FREE_RIDER:
        return w.copy()
    noise = np.random.default_rng([pid, server_round]).normal(size=DIM)
    scale = 1e-3 if pid in SYBILS else 0.05
    toward = TARGETS[pid] - w
    move = -toward if pid in BAD else 0.5 * toward
    return (w + move + scale * noise).astype(np.float32)


def step_scale(pid: int) -> float:
    """How far client ``pid``'s training moves a parameter for a unit gradient: lr 0.05 times
    its steps (batches of 10)."""
    return 0.05 * math.ceil(EXAMPLES[pid] / 10)


def bias_step(pid: int, b: np.ndarray) -> np.ndarray:
    """Client ``pid``'s new output bias from ``b``: its step scale times the cross-entropy
    gradient's negative ``q - softmax(b)`` toward its label distribution ``q`` (away from it
    for the two bad clients; the free rider's unchanged, the copier's client 0's)."""
    if pid == COPIER:
        return bias_step(0, b)
    if pid == FREE_RIDER:
        return b.copy()
    p = np.exp(b - b.max()) / np.exp(b - b.max()).sum()
    sign = -1.0 if pid in BAD else 1.0
    return (b + sign * step_scale(pid) * (LABELS[pid] - p)).astype(np.float32)


def local_loss(pid: int, w: np.ndarray) -> float:
    """The model's loss on client ``pid``'s data: the squared distance to its target."""
    return float(np.sum((TARGETS[pid] - w) ** 2))


def handler(msg: Message, ctx: Context) -> Message:
    pid = int(ctx.node_config["partition-id"])
    client = ConfigRecord({"client-id": f"c{pid}"})
    config = msg.content.config_records.get("config")
    if msg.metadata.message_type == "query":
        content = RecordDict({"client": client})
        if config is not None and config.get(LOCAL_LOSS_FIELD):
            w = record_to_state(msg.content["arrays"])["w"]
            content["metrics"] = MetricRecord({LOCAL_LOSS_FIELD: local_loss(pid, w),
                                               "num-examples": int(EXAMPLES[pid])})
        return Message(content, reply_to=msg)
    assert config is not None
    model = record_to_state(msg.content["arrays"])
    server_round = int(config["server-round"])  # type: ignore[arg-type]
    new = {"w": step(pid, model["w"], server_round)}
    if "out.bias" in model:
        new |= {"out.weight": model["out.weight"], "out.bias": bias_step(pid, model["out.bias"])}
    loss = local_loss(pid, new["w"])
    metrics = MetricRecord({"num-examples": int(EXAMPLES[pid]), "train-loss": loss})
    if config.get(LOSS_SQUARES_FIELD):
        metrics[LOSS_SQUARES_FIELD] = float(EXAMPLES[pid]) * loss ** 2
    if config.get(STEP_SCALE_FIELD):
        metrics[STEP_SCALE_FIELD] = step_scale(pid)
    return Message(RecordDict({"arrays": state_to_record(new), "metrics": metrics,
                               "client": client}), reply_to=msg)


def utility_factory(global_state: Mapping[str, np.ndarray],
                    states: Sequence[Mapping[str, np.ndarray]], examples: Sequence[int]) -> Any:
    ws = np.stack([s["w"] for s in states]).astype(np.float64)
    n_ex = np.asarray(examples, dtype=np.float64)

    def utility(masks: np.ndarray) -> np.ndarray:
        out = np.empty(len(masks))
        for r, m in enumerate(masks):
            w = global_state["w"] if not m.any() else (n_ex[m] @ ws[m]) / n_ex[m].sum()
            out[r] = -float(np.sum((w - COMMON) ** 2))
        return out

    return utility


def model_of(with_bias: bool, saved: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The model: ``w`` and, ``with_bias``, an output layer (its weight fixed at zeros), each
    zeros or as a checkpoint ``saved`` keeps it (``w``, ``bias``)."""
    def kept(field: str, size: int) -> np.ndarray:
        return np.zeros(size, np.float32) if saved is None else np.asarray(saved[field],
                                                                           np.float32)

    if not with_bias:
        return {"w": kept("w", DIM)}
    return {"w": kept("w", DIM), "out.weight": np.zeros((CLASSES, 2), np.float32),
            "out.bias": kept("bias", CLASSES)}
