"""Adversarial clients: who they are, and what the ClientApp returns for each kind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from client_app.app import train_handler
from fedowen_task.adversary.attacks import ATTACKS, server_side
from fedowen_task.adversary.client import (
    ClientTurn,
    boosted_update,
    colluding_copy,
    disguised_update,
    flip_labels,
    huge_statistics,
    noise_update,
    replay_update,
    scaled_statistics,
    sign_flipped_update,
)
from fedowen_task.adversary.keys import adversary_ids
from fedowen_task.config import TaskConfig
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
    state = {"w": torch.zeros(1000), "n": torch.tensor(3), "bn.running_var": torch.ones(4),
             "bn.running_mean": torch.zeros(4)}
    out = noise_update(state, 0.5, seed=1)
    assert out["n"].item() == 3
    # the running statistics stay the global model's (a negative variance is rejected)
    assert torch.equal(out["bn.running_var"], torch.ones(4))
    assert torch.equal(out["bn.running_mean"], torch.zeros(4))
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


# Attacks on contribution schemes (issue 17)

def _lenet_pair() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A global model and an 'honest' trained model 0.01 x N(0, 1) away from it."""
    glob = build_model("lenet", 1, 10, seed=0).state_dict()
    gen = torch.Generator().manual_seed(5)
    trained = {k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in glob.items()}
    return glob, trained


def _norm(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(((a[k] - b[k]).double() ** 2).sum() for k in a)))


def test_disguised_free_rider_sends_noise_of_the_honest_norm() -> None:
    glob, trained = _lenet_pair()
    out = disguised_update(glob, trained, seed=3)
    assert _norm(out, glob) == pytest.approx(_norm(trained, glob), rel=1e-5)
    # pure noise: no alignment with the honest update, and reproducible from its seed
    d_out = torch.cat([(out[k] - glob[k]).ravel() for k in glob])
    d_hon = torch.cat([(trained[k] - glob[k]).ravel() for k in glob])
    assert abs(float(torch.nn.functional.cosine_similarity(d_out, d_hon, dim=0))) < 0.05
    assert all(torch.equal(out[k], disguised_update(glob, trained, seed=3)[k]) for k in glob)


def test_replay_free_rider_adds_the_last_global_update_per_round() -> None:
    # Prepare: the client is sent g1 in round 1, then g4 in round 4 (not selected in between)
    memory = RecordDict()
    g1 = {"w": torch.zeros(3), "count": torch.tensor(7)}
    g4 = {"w": torch.tensor([3.0, -6.0, 0.0]), "count": torch.tensor(9)}
    # Execute
    first = replay_update(g1, memory, server_round=1)
    second = replay_update(g4, memory, server_round=4)
    # Assert: nothing to replay at first; then g4 + (g4 - g1) / 3 = (4, -8, 0), counters kept
    assert torch.equal(first["w"], g1["w"])
    torch.testing.assert_close(second["w"], torch.tensor([4.0, -8.0, 0.0]))
    assert second["count"].item() == 9
    assert memory.config_records["replay-round"]["round"] == 4


def test_colluding_sybil_copies_are_near_but_not_exact_duplicates() -> None:
    from fedowen_strategy.defences.links import duplicate_groups

    glob, trained = _lenet_pair()
    copies = [colluding_copy(glob, trained, 0.1, seed=s) for s in (1, 2)]
    # each copy is 0.1 x the update's norm away from the shared update
    assert _norm(copies[0], trained) == pytest.approx(0.1 * _norm(trained, glob), rel=1e-4)
    assert not torch.equal(copies[0]["stem.weight"], copies[1]["stem.weight"])
    as_np = [{k: v.numpy() for k, v in c.items()} for c in copies]
    ref = {k: v.numpy() for k, v in glob.items()}
    # about 0.14 x the norm apart: the default duplicate-tolerance (1e-6) and even 0.05 miss
    # them, a tolerance of 0.2 catches them; without noise they are exact duplicates
    from server_app.config import RunConfig

    assert duplicate_groups(as_np, ref, RunConfig.duplicate_tolerance) == []
    assert duplicate_groups(as_np, ref, 0.05) == []
    assert duplicate_groups(as_np, ref, 0.2) == [[0, 1]]
    assert colluding_copy(glob, trained, 0.0, seed=1)["fc1.bias"].equal(trained["fc1.bias"])


def test_boosted_update_scales_the_honest_one() -> None:
    glob, trained = _lenet_pair()
    out = boosted_update(glob, trained, 2.5)
    for k in glob:
        torch.testing.assert_close(out[k] - glob[k], 2.5 * (trained[k] - glob[k]))


@pytest.mark.parametrize("kind", ["disguised-free-rider", "boosted", "colluding-sybil"])
def test_client_app_runs_the_new_attacks(kind: str, shared_data_dir: Path) -> None:
    glob, out, loss = _reply(kind, shared_data_dir)
    honest_glob, honest, _ = _reply(kind, shared_data_dir, fraction=0.0)
    norm, honest_norm = _norm(out, glob), _norm(honest, honest_glob)
    assert np.isfinite(loss)  # each trained (to measure, boost or share its update)
    if kind == "disguised-free-rider":
        assert norm == pytest.approx(honest_norm, rel=1e-4)
    elif kind == "boosted":
        assert norm == pytest.approx(2.5 * honest_norm, rel=1e-4)
    else:  # partition 0 is its own Sybil master here: honest update plus 0.1 x norm noise
        assert _norm(out, honest) == pytest.approx(0.1 * honest_norm, rel=1e-3)


def test_client_app_replay_free_rider_remembers_the_global_model(shared_data_dir: Path) -> None:
    # Prepare: one client context across two rounds, global models g and g + 0.01
    run_config = {"dataset": "mnist", "data-dir": str(shared_data_dir), "client-max-samples": 40,
                  "adversary-fraction": 1.0, "adversary-kind": "replay-free-rider"}
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 4},
                  state=RecordDict(), run_config=run_config)
    g = build_model("lenet", 1, 10, seed=0).state_dict()
    outs = []
    for server_round, shift in ((2, 0.0), (4, 0.02)):
        msg = Message(RecordDict({"arrays": ArrayRecord({k: v + shift for k, v in g.items()}),
                                  "config": ConfigRecord({"server-round": server_round})}),
                      message_type=MessageType.TRAIN, dst_node_id=7)
        outs.append(train_handler(msg, ctx).content.array_records["arrays"]
                    .to_torch_state_dict())
    # Assert: round 2 returns g; round 4 returns (g + 0.02) + 0.02 / 2
    torch.testing.assert_close(outs[0]["fc1.weight"], g["fc1.weight"])
    torch.testing.assert_close(outs[1]["fc1.weight"], g["fc1.weight"] + 0.03)


# Sign flip and the server-side kinds (issue 26)

def test_sign_flipped_update_reverses_the_honest_one() -> None:
    # Prepare: an 'honest' model 0.01 x N(0, 1) away, and an integer buffer it counted up
    floats, trained_floats = _lenet_pair()
    glob = {**floats, "count": torch.tensor(3)}
    trained = {**trained_floats, "count": torch.tensor(5)}
    # Execute
    out = sign_flipped_update(glob, trained)
    # Assert: delta = -honest delta on every floating tensor; the counter as trained
    for k in glob:
        if k == "count":
            assert out[k].item() == 5
        else:
            torch.testing.assert_close(out[k] - glob[k], -(trained[k] - glob[k]))
    out_floats = {k: out[k] for k in floats}
    assert _norm(out_floats, trained_floats) == pytest.approx(
        2 * _norm(trained_floats, floats), rel=1e-5)


@pytest.mark.parametrize("kind", ["sign-flip", *server_side()])
def test_the_table_dispatches_the_new_kinds(kind: str) -> None:
    glob, trained = _lenet_pair()
    turn = ClientTurn(TaskConfig().adversary(), server_round=1, seed=0, attack_seed=1,
                      memory=RecordDict())
    out = ATTACKS[kind].client_reply(glob, trained, turn)
    sign = -1.0 if kind == "sign-flip" else 1.0  # server-side kinds reply as honest ones
    for k in glob:
        torch.testing.assert_close(out[k] - glob[k], sign * (trained[k] - glob[k]))


@pytest.mark.parametrize("kind", ["sign-flip", "alie"])
def test_client_app_sign_flip_and_server_side_kinds(kind: str, shared_data_dir: Path) -> None:
    # Execute: the adversary's reply and the same partition's honest one (same training seed)
    glob, out, loss = _reply(kind, shared_data_dir)
    _, honest, honest_loss = _reply(kind, shared_data_dir, fraction=0.0)
    # Assert: sign flip sends exactly the reversed update; ALIE's client replies as an honest
    # one, bit for bit (the ServerApp replaces it)
    assert loss == honest_loss
    for k in glob:
        if kind == "alie" or not glob[k].is_floating_point():
            assert torch.equal(out[k], honest[k])
        else:
            torch.testing.assert_close(out[k] - glob[k], -(honest[k] - glob[k]))


# The statistics attacks (issue 70): honest parameters, attacked BatchNorm statistics

def _bn_trained() -> dict[str, torch.Tensor]:
    return {"conv.weight": torch.full((2, 2), 0.3), "bn.weight": torch.ones(2),
            "bn.running_mean": torch.tensor([0.5, -1.0]),
            "bn.running_var": torch.tensor([2.0, 0.25]),
            "bn.num_batches_tracked": torch.tensor(7)}


def test_huge_statistics_sends_valid_huge_statistics_and_the_honest_parameters() -> None:
    # Prepare
    trained = _bn_trained()
    # Execute
    out = huge_statistics(trained)
    # Assert: variance 1e6 and mean 1e3 in every channel (float32 kept), the rest as trained
    assert torch.equal(out["bn.running_var"], torch.full((2,), 1e6))
    assert torch.equal(out["bn.running_mean"], torch.full((2,), 1e3))
    assert out["bn.running_var"].dtype == torch.float32
    for key in ("conv.weight", "bn.weight", "bn.num_batches_tracked"):
        assert torch.equal(out[key], trained[key])


def test_scaled_statistics_multiplies_them_by_the_key() -> None:
    # Prepare: adversary-statistics-scale 4 (the default)
    trained = _bn_trained()
    turn = ClientTurn(TaskConfig().adversary(), server_round=1, seed=0, attack_seed=1,
                      memory=RecordDict())
    assert turn.cfg.statistics_scale == 4.0
    # Execute
    out = ATTACKS["scaled-statistics"].client_reply(trained, trained, turn)
    # Assert: 4 x (0.5, -1) and 4 x (2, 0.25), by hand; the parameters as trained
    torch.testing.assert_close(out["bn.running_mean"], torch.tensor([2.0, -4.0]))
    torch.testing.assert_close(out["bn.running_var"], torch.tensor([8.0, 1.0]))
    assert torch.equal(out["conv.weight"], trained["conv.weight"])
    assert torch.equal(scaled_statistics(trained, 0.5)["bn.running_var"],
                       torch.tensor([1.0, 0.125]))


def test_a_model_without_statistics_gets_its_honest_update_from_both() -> None:
    glob, trained = _lenet_pair()
    turn = ClientTurn(TaskConfig().adversary(), server_round=1, seed=0, attack_seed=1,
                      memory=RecordDict())
    for kind in ("huge-statistics", "scaled-statistics"):
        out = ATTACKS[kind].client_reply(glob, trained, turn)
        assert all(torch.equal(out[k], trained[k]) for k in trained)
