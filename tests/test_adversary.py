"""Adversarial clients: who they are, and what the ClientApp returns for each kind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from client_app.adversary import adversary_ids, flip_labels, noise_update
from client_app.app import train_handler
from fedowen_task.models import build_model


def test_adversary_ids_are_seeded_and_sized() -> None:
    a = adversary_ids(100, 0.2, seed=3)
    assert len(a) == 20 and a == adversary_ids(100, 0.2, seed=3)
    assert a != adversary_ids(100, 0.2, seed=4)
    # a larger fraction extends the same seeded order: 20% adversaries stay adversaries at 30%
    assert a < adversary_ids(100, 0.3, seed=3) and len(adversary_ids(100, 0.3, seed=3)) == 30
    assert adversary_ids(10, 0.0, seed=0) == frozenset()
    with pytest.raises(ValueError, match=r"adversary-fraction=1\.5"):
        adversary_ids(10, 1.5, seed=0)


def test_flip_labels_moves_every_label() -> None:
    y = torch.arange(10)
    assert flip_labels(y, 10).tolist() == list(range(9, -1, -1))


def test_noise_update_perturbs_floats_only() -> None:
    state = {"w": torch.zeros(1000), "n": torch.tensor(3)}
    out = noise_update(state, 0.5, seed=1)
    assert out["n"].item() == 3
    assert abs(out["w"].std().item() - 0.5) < 0.05
    torch.testing.assert_close(out["w"], noise_update(state, 0.5, seed=1)["w"])


def _reply(kind: str, shared_data_dir: Path, pid: int = 0, fraction: float = 1.0
           ) -> tuple[dict[str, torch.Tensor], dict, float]:
    run_config = {"dataset": "mnist", "data-dir": str(shared_data_dir), "client-max-samples": 40,
                  "adversary-fraction": fraction, "adversary-kind": kind}
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": pid, "num-partitions": 4},
                  state=RecordDict(), run_config=run_config)
    model = build_model("lenet", 1, 10, seed=0)
    glob = {k: v.clone() for k, v in model.state_dict().items()}
    msg = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "config": ConfigRecord({"server-round": 1})}),
                  message_type=MessageType.TRAIN, dst_node_id=7)
    reply = train_handler(msg, ctx)
    out = reply.content.array_records["arrays"].to_torch_state_dict()
    loss = reply.content.metric_records["metrics"]["train-loss"]
    return glob, out, float(loss)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["free-rider", "noise", "label-flip"])
def test_client_app_misbehaves_as_configured(kind: str, shared_data_dir: Path) -> None:
    glob, out, loss = _reply(kind, shared_data_dir)
    diff = max((out[k].float() - glob[k].float()).abs().max().item() for k in glob)
    if kind == "free-rider":
        assert diff == 0.0 and np.isnan(loss)
    elif kind == "noise":
        assert 0.1 < diff < 1.0 and np.isnan(loss)  # 0.05-std noise over ~60k weights
    else:
        assert diff > 0 and np.isfinite(loss)  # trained (on flipped labels)


def test_sybils_return_copies_of_one_update(shared_data_dir: Path) -> None:
    # Prepare: half of 4 partitions are Sybils of one actor; the other half honest
    bad = sorted(adversary_ids(4, 0.5, 0))
    good = sorted(set(range(4)) - set(bad))
    # Execute
    sybils = [_reply("sybil", shared_data_dir, pid, 0.5)[1] for pid in bad]
    honest = _reply("sybil", shared_data_dir, good[0], 0.5)[1]
    # Assert: the two Sybils' states are identical, the honest one's is not
    assert all(torch.equal(sybils[0][k], sybils[1][k]) for k in honest)
    assert not all(torch.equal(sybils[0][k], honest[k]) for k in honest)
