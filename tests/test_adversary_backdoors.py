"""The attacks the backdoor peers were measured against (issue 72), on hand-built data:
DBA's distributed trigger (the bars by hand), Neurotoxin's mask (by hand, and the local steps
it leaves alone), and the adaptive backdoor's update passing a hand-set cap."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict

from client_app.app import app as client_app
from fedowen_task.adversary.attacks import ATTACKS, measured_trigger, server_side
from fedowen_task.adversary.backdoor import stamp, trigger_box, trigger_mask
from fedowen_task.adversary.client import ClientTurn, TorchState, distributed
from fedowen_task.adversary.keys import AdversaryConfig, Trigger
from fedowen_task.adversary.neurotoxin import (
    LAST_ROUND,
    MASK,
    MASK_SOURCE,
    clean_gradient,
    confine,
    coordinate_mask,
    last_change,
    masked_gradients,
    remember,
    reply,
    training_mask,
)
from fedowen_task.adversary.server import (
    RoundView,
    adaptive_backdoor,
    cone_projection,
    cosine,
    honest_alignment,
)
from fedowen_task.config import ConfigError
from fedowen_task.data import white
from server_app.app import run
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid

DBA_MNIST = Trigger(shape="bars", size=4, position="top-left", parts=4, gap=2)


def adversary(**keys: object) -> AdversaryConfig:
    return parse_run_config({"adversary-fraction": 0.2, **keys}).adversary()


# DBA ---------------------------------------------------------------------------------------

def test_dba_bars_are_the_papers_mnist_pattern_and_split_into_its_bars() -> None:
    # Prepare: DBA's MNIST trigger, 4 bars of 1x4, gap 2 (rows 0 and 3, columns 0-3 and 6-9
    # of its box), one pixel from the top-left corner
    expected = torch.zeros(28, 28, dtype=torch.bool)
    bars = [(1, slice(1, 5)), (1, slice(7, 11)), (4, slice(1, 5)), (4, slice(7, 11))]
    for row, cols in bars:
        expected[row, cols] = True
    # Execute
    whole = trigger_mask(DBA_MNIST, 28, 28)
    parts = [trigger_mask(DBA_MNIST, 28, 28, part) for part in range(4)]
    # Assert: the whole pattern by hand; each part one bar where the pattern puts it
    assert torch.equal(whole, expected) and int(whole.sum()) == 16
    for (row, cols), part in zip(bars, parts, strict=True):
        alone = torch.zeros(28, 28, dtype=torch.bool)
        alone[row, cols] = True
        assert torch.equal(part, alone)
    assert torch.equal(parts[0] | parts[1] | parts[2] | parts[3], whole)


def test_bars_of_three_parts_and_their_bottom_right_place() -> None:
    # Prepare: 3 bars of 2 -> 2 columns, 2 rows; box 3 (rows 0, 2) x 5 (columns 0-1, 3-4)
    trigger = Trigger(shape="bars", size=2, parts=3, gap=1)
    # Execute
    box = trigger_box(trigger)
    mask = trigger_mask(trigger, 10, 10)
    # Assert
    by_hand = torch.tensor([[1, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(box, by_hand)
    assert torch.equal(mask[6:9, 4:9], by_hand) and int(mask.sum()) == 6  # margin row/col 9


def test_parts_that_do_not_exist_are_refused() -> None:
    with pytest.raises(ValueError, match="has no parts"):
        trigger_box(Trigger(shape="square"), 0)
    with pytest.raises(ValueError, match="part 4 is not a bar of a 4-bar trigger"):
        trigger_box(DBA_MNIST, 4)
    with pytest.raises(ValueError, match=r"\(4x10 pixels\) does not fit a 8x8 image"):
        trigger_mask(DBA_MNIST, 8, 8)


def test_a_dba_client_stamps_the_bar_of_its_rank() -> None:
    # Prepare: the 6th adversary (rank 5) of a 4-bar DBA plants bar 5 mod 4 = 1
    cfg = adversary(**{"adversary-kind": "dba", "adversary-trigger": "bars",
                       "adversary-trigger-size": 4, "adversary-trigger-position": "top-left",
                       "adversary-poison-fraction": 1.0, "adversary-target": 7})
    x, y = torch.zeros(3, 1, 28, 28), torch.tensor([1, 2, 3])
    turn = ClientTurn(cfg, 1, 0, 0, RecordDict(), 10, "mnist", white("mnist"), rank=5)
    # Execute
    px, py = distributed(x, y, turn)
    # Assert: every image (fraction 1) changed exactly on bar 1, relabelled to 7
    bar = torch.zeros(28, 28, dtype=torch.bool)
    bar[1, 7:11] = True
    assert torch.equal((px != x).any(dim=(0, 1)), bar) and torch.all(py == 7)
    assert torch.equal(px, stamp(x, DBA_MNIST, white("mnist"), 1))
    with pytest.raises(ValueError, match="needs the client's rank"):
        distributed(x, y, ClientTurn(cfg, 1, 0, 0, RecordDict(), 10, "mnist", white("mnist")))


def test_rank_orders_the_adversaries_by_id() -> None:
    # Prepare
    cfg = adversary()
    ids = sorted(cfg.ids(20))
    honest = next(i for i in range(20) if i not in ids)
    # Execute / Assert: 4 adversaries of 20 ranked 0..3 by id; an honest partition -1
    assert [cfg.rank(i, 20) for i in ids] == [0, 1, 2, 3]
    assert cfg.rank(honest, 20) == -1


def test_the_attack_keys_are_checked_with_clear_errors() -> None:
    with pytest.raises(ConfigError, match="adversary-kind='dba' works with adversary-trigger "
                       "bars only, got 'square': set adversary-trigger='bars'"):
        parse_run_config({"adversary-kind": "dba"})
    with pytest.raises(ConfigError, match=r"adversary-dba-parts=0 must be >= 1"):
        parse_run_config({"adversary-dba-parts": 0})
    with pytest.raises(ConfigError, match=r"adversary-dba-gap=-1 must be >= 0"):
        parse_run_config({"adversary-dba-gap": -1})
    with pytest.raises(ConfigError, match=r"adversary-neurotoxin-top=1.0 must lie in"):
        parse_run_config({"adversary-neurotoxin-top": 1.0})
    # the bars trigger also serves the centralised backdoor (DBA's baseline)
    assert parse_run_config({"adversary-trigger": "bars"}).adversary().backdoor().shape == "bars"


def test_the_backdoor_rows_measure_attack_success_with_the_whole_trigger() -> None:
    # Prepare / Execute
    dba = measured_trigger(adversary(**{"adversary-kind": "dba", "adversary-trigger": "bars"}))
    # Assert: DBA's global pattern at test time; no trigger for other attacks or no attackers
    assert dba == Trigger(shape="bars", size=3, parts=4, gap=2)
    for kind in ("backdoor", "neurotoxin", "adaptive-backdoor"):
        assert measured_trigger(adversary(**{"adversary-kind": kind})) == Trigger()
    assert measured_trigger(adversary(**{"adversary-kind": "boosted"})) is None
    inactive = parse_run_config({"adversary-kind": "backdoor"}).adversary()
    assert measured_trigger(inactive) is None
    assert {k for k, row in ATTACKS.items() if row.backdoor} == {
        "backdoor", "dba", "neurotoxin", "adaptive-backdoor"}
    assert "adaptive-backdoor" in server_side()


# Neurotoxin ---------------------------------------------------------------------------------

def test_the_mask_leaves_the_largest_coordinates_of_the_change_alone() -> None:
    # Prepare: 5 coordinates over two tensors; 40% of them: the 2 largest |change|
    change = {"a": torch.tensor([0.1, -0.5, 0.3]), "b": torch.tensor([[0.05, 0.9]])}
    # Execute
    mask = coordinate_mask(change, 0.4)
    # Assert: 0.9 (b[0, 1]) and -0.5 (a[1]) masked off, ranked over both tensors together
    assert mask["a"].tolist() == [True, False, True]
    assert mask["b"].tolist() == [[True, False]]
    assert all(bool(m.all()) for m in coordinate_mask(change, 0.0).values())
    assert int(sum(m.numel() - m.sum() for m in coordinate_mask(change, 0.5).values())) == 2
    with pytest.raises(ValueError, match=r"adversary-neurotoxin-top=1\.0 must lie in"):
        coordinate_mask(change, 1.0)


def test_the_change_is_the_last_global_model_it_was_sent() -> None:
    # Prepare: round 3's model kept; round 5's global
    memory = RecordDict()
    remember({"w": torch.tensor([1.0, 2.0]), "bn.running_var": torch.ones(2)}, memory, 3)
    now = {"w": torch.tensor([1.5, 1.0]), "bn.running_var": torch.full((2,), 4.0)}
    # Execute / Assert: the parameters' change (no statistics); none from a later round
    change = last_change(now, memory, 5)
    assert change is not None and list(change) == ["w"]
    assert change["w"].tolist() == [0.5, -1.0]
    assert last_change(now, memory, 3) is None and last_change(now, RecordDict(), 5) is None


def test_masked_local_steps_never_move_the_masked_coordinates() -> None:
    # Prepare: a linear model, its weight's second and fourth coordinates masked off
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mask = {"weight": torch.tensor([[True, False], [True, False]])}
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = torch.randn(16, 2), torch.randint(0, 2, (16,))
    # Execute: 5 steps under the mask
    with masked_gradients(model, mask):
        for _ in range(5):
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimiser.step()
    moved = model.weight.detach() - start["weight"]
    # Assert: the masked column exactly still, the free one and the bias moved
    assert torch.all(moved[:, 1] == 0) and torch.all(moved[:, 0] != 0)
    assert not torch.equal(model.bias.detach(), start["bias"])
    # the hooks are gone once closed: a later step moves every coordinate
    optimiser.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grad = model.weight.grad
    assert grad is not None and torch.all(grad[:, 1] != 0)


def test_the_reply_is_confined_to_the_kept_mask_then_boosted_and_the_model_kept() -> None:
    # Prepare: this round's mask kept by the training (w[1] and w[2] off), boost 2
    cfg = adversary(**{"adversary-kind": "neurotoxin", "adversary-boost": 2.0})
    memory = RecordDict()
    memory[MASK] = ArrayRecord({"w": torch.tensor([1, 0, 0, 1], dtype=torch.uint8)})
    glob = {"w": torch.tensor([1.0, 1.0, 1.0, 1.0]), "n": torch.tensor(3)}
    trained = {"w": torch.tensor([1.5, 0.0, 2.0, 0.5]), "n": torch.tensor(4)}
    # Execute
    out = reply(glob, trained, ClientTurn(cfg, 4, 0, 0, memory))
    # Assert: update [0.5, 0, 0, -0.5] x 2 on the free coordinates; counters as trained; the
    # round's model kept for the next change, the mask dropped
    assert out["w"].tolist() == [2.0, 1.0, 1.0, 0.0] and int(out["n"]) == 4
    assert memory.config_records[LAST_ROUND]["round"] == 4 and MASK not in memory.array_records
    # without a mask (a share of 0): the backdoor's boosted update, every coordinate
    fresh = reply(glob, trained, ClientTurn(cfg, 1, 0, 0, RecordDict()))
    assert fresh["w"].tolist() == [2.0, -1.0, 3.0, 0.0]
    assert torch.equal(confine(glob, trained, None)["w"], trained["w"])


def zero_linear() -> torch.nn.Linear:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    return model


def test_without_an_earlier_model_the_mask_ranks_its_own_clean_gradient() -> None:
    # Prepare: zero weights (softmax 0.5, 0.5), x = [1, 0] and [0, 3], both of class 0: the
    # summed gradient by hand is W: [[-0.5, -1.5], [0.5, 1.5]], b: [-1, 1]
    model = zero_linear()
    x, y = torch.tensor([[1.0, 0.0], [0.0, 3.0]]), torch.tensor([0, 0])
    cfg = adversary(**{"adversary-kind": "neurotoxin", "adversary-neurotoxin-top": 1 / 3})
    memory = RecordDict()
    glob = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # Execute
    grad = clean_gradient(model, x, y)
    mask = training_mask(model, glob, x, y, ClientTurn(cfg, 1, 0, 0, memory))
    # Assert: the gradient by hand, the model untouched; the 2 largest (W[:, 1]) left alone
    assert torch.allclose(grad["weight"], torch.tensor([[-0.5, -1.5], [0.5, 1.5]]))
    assert torch.allclose(grad["bias"], torch.tensor([-1.0, 1.0]))
    assert model.weight.grad is None and torch.all(model.weight == 0)
    assert mask is not None and mask["weight"].tolist() == [[True, False], [True, False]]
    assert mask["bias"].tolist() == [True, True]
    assert memory.config_records[MASK_SOURCE]["source"] == "own-gradient"
    assert torch.equal(memory.array_records[MASK].to_torch_state_dict()["weight"].bool(),
                       mask["weight"])


def test_the_neurotoxin_row_masks_the_clients_training() -> None:
    # Prepare: the row's training context with a kept model whose change is all in weight[0, 0]
    cfg = adversary(**{"adversary-kind": "neurotoxin", "adversary-neurotoxin-top": 0.25})
    model = torch.nn.Linear(2, 2)
    glob = {k: v.detach().clone() for k, v in model.state_dict().items()}
    past = {k: v.clone() for k, v in glob.items()}
    past["weight"][0, 0] -= 10.0
    memory = RecordDict()
    remember(past, memory, 1)
    x, y = torch.randn(8, 2), torch.randint(0, 2, (8,))
    turn = ClientTurn(cfg, 2, 0, 0, memory)
    # Execute: one gradient under the row's context (6 coordinates, the largest 25%: 2 off)
    with ATTACKS["neurotoxin"].training(model, glob, x, y, turn):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    # Assert: weight[0, 0] (change 10) and one tie (0: first in order, weight[0, 1]) are off
    grad = model.weight.grad
    assert grad is not None and grad[0, 0] == 0 and grad[0, 1] == 0
    assert torch.all(grad[1] != 0)
    assert memory.config_records[MASK_SOURCE]["source"] == "global-change"


# The adaptive backdoor -------------------------------------------------------------------------

ROOT10 = math.sqrt(10)


def test_the_cone_projection_by_hand() -> None:
    # Execute / Assert: [0, 1] turned to cosine 0.6 with [1, 0]; inside the cone: unchanged
    assert np.allclose(cone_projection(np.array([0.0, 1.0]), np.array([1.0, 0.0]), 0.6),
                       [0.6, 0.8])
    inside = np.array([0.8, 0.6])
    assert np.array_equal(cone_projection(inside, np.array([1.0, 0.0]), 0.6), inside)
    # exactly against it: turned towards the axis where the reference is smallest, norm kept
    back = cone_projection(np.array([-2.0, 0.0]), np.array([1.0, 0.0]), 0.6)
    assert np.allclose(back, [1.2, 1.6])
    with pytest.raises(ValueError, match="a cosine must lie in"):
        cone_projection(inside, inside, 1.5)


def test_the_adaptive_backdoor_passes_a_hand_set_cap() -> None:
    # Prepare: honest [1, 0, 0] and [0.8, 0.6, 0] (mean [0.9, 0.3, 0]; each at cosine
    # 3/sqrt(10) with it); two backdoored updates off that direction; a cap of 1
    honest = np.array([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0]])
    own = np.array([[0.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    view = RoundView(honest, own, 4, [10, 10], lambda examples: 1.0)
    cfg = adversary(**{"adversary-kind": "adaptive-backdoor"})
    # Execute
    sent, params = adaptive_backdoor(view, cfg)
    # Assert: each turned onto the cone (by hand: [0.9, 0.3, 1/sqrt(10)] and [0.8, 0.6, 0]),
    # at 0.99 x the cap: under it, and as aligned with the honest mean as an honest update
    assert honest_alignment(honest) == pytest.approx(3 / ROOT10)
    assert np.allclose(sent, 0.99 * np.array([[0.9, 0.3, 1 / ROOT10], [0.8, 0.6, 0.0]]))
    mean = honest.mean(axis=0)
    for row in sent:
        assert np.linalg.norm(row) == pytest.approx(0.99) and np.linalg.norm(row) <= 1.0
        assert cosine(row, mean) == pytest.approx(3 / ROOT10)
    assert params["least_cosine"] == pytest.approx(3 / ROOT10)
    assert params["cosines_before"] == pytest.approx([0.0, 1 / ROOT10])
    assert params["factors"] == pytest.approx([0.99 / 2, 0.99 / 3])


def test_without_a_bound_or_honest_updates_it_boosts_as_trained() -> None:
    # Prepare: one honest update only, no bound in force, boost 2.5
    view = RoundView(np.array([[1.0, 0.0]]), np.array([[0.0, 2.0]]), 2, [5],
                     lambda examples: None)
    cfg = adversary(**{"adversary-kind": "adaptive-backdoor", "adversary-boost": 2.5})
    # Execute
    sent, params = adaptive_backdoor(view, cfg)
    # Assert: no honest direction to read: the direction as trained, x adversary-boost
    assert np.allclose(sent, [[0.0, 5.0]]) and params["least_cosine"] is None


# Through the real apps ---------------------------------------------------------------------

def test_the_real_clientapp_trains_neurotoxin_and_dba_as_their_rows_say(
        shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare: 2 of 4 clients attack, all 4 drawn in each of 2 rounds; spies around the rows'
    # hooks record what the ClientApp handed them
    seen: list[tuple[int, str, dict[str, torch.Tensor], TorchState, TorchState,
                     TorchState]] = []
    ranks: list[int] = []
    row, dba_row = ATTACKS["neurotoxin"], ATTACKS["dba"]

    def spy_reply(glob: TorchState, trained: TorchState, turn: ClientTurn
                  ) -> dict[str, torch.Tensor]:
        kept = turn.memory.array_records[MASK].to_torch_state_dict()
        source = str(turn.memory.config_records[MASK_SOURCE]["source"])
        out = reply(glob, trained, turn)
        seen.append((turn.server_round, source, {k: v.bool() for k, v in kept.items()},
                     dict(glob), dict(trained), out))
        return out

    def spy_data(x: torch.Tensor, y: torch.Tensor, turn: ClientTurn
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        ranks.append(turn.rank)
        return distributed(x, y, turn)

    base = {"dataset": "mnist", "data-dir": str(shared_data_dir), "num-server-rounds": 2,
            "clients-per-round": 4, "client-max-samples": 20, "test-max-samples": 100,
            "adversary-fraction": 0.5, "adversary-neurotoxin-top": 0.05}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    ATTACKS["neurotoxin"] = replace(row, reply=spy_reply)
    ATTACKS["dba"] = replace(dba_row, data=spy_data)
    try:
        # Execute: the real ClientApp over the in-process grid, the real ServerApp
        for kind, extra in (("neurotoxin", {}), ("dba", {"adversary-trigger": "bars"})):
            cfg = {**base, "adversary-kind": kind, "output-dir": str(tmp_path / kind), **extra}
            run(InProcessGrid(client_app, nodes, cfg), parse_run_config(cfg), tmp_path / kind)
    finally:
        ATTACKS["neurotoxin"], ATTACKS["dba"] = row, dba_row
    # Assert: Neurotoxin's mask came from its own gradient in round 1 and from the global
    # change in round 2; 5% of the coordinates masked off; the trained model (SGD with
    # momentum, every step masked) and the reply never moved them, the reply moved the others
    assert sorted((r, s) for r, s, *_ in seen) == [(1, "own-gradient"), (1, "own-gradient"),
                                                  (2, "global-change"), (2, "global-change")]
    for _, _, mask, glob, trained, out in seen:
        off = sum(int((~m).sum()) for m in mask.values())
        assert off == round(0.05 * sum(m.numel() for m in mask.values())) and off > 0
        for k, m in mask.items():
            assert torch.equal(trained[k][~m], glob[k][~m])  # the masked steps never moved
            assert torch.equal(out[k][~m], glob[k][~m])
        assert any(bool((out[k] != glob[k])[m].any()) for k, m in mask.items())
    # DBA's two attackers planted bars 0 and 1 (their ranks) in both rounds
    assert sorted(ranks) == [0, 0, 1, 1]
    # and the run measured its attack success every evaluated round (rounds 0, 1 and 2)
    evaluated = [r for r in read_rounds(tmp_path / "dba") if "test_accuracy" in r]
    assert len(evaluated) == 3 and all("attack_success" in r for r in evaluated)


def test_the_adaptive_backdoor_passes_the_real_defaults_unclipped(shared_data_dir: Path,
                                                                   tmp_path: Path) -> None:
    # Prepare: 2 of 4 clients attack, all 4 drawn, one round under the app's defaults
    cfg = {"dataset": "mnist", "data-dir": str(shared_data_dir), "num-server-rounds": 1,
           "clients-per-round": 4, "client-max-samples": 20, "test-max-samples": 100,
           "adversary-fraction": 0.5, "adversary-kind": "adaptive-backdoor",
           "output-dir": str(tmp_path)}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    # Execute
    run(InProcessGrid(client_app, nodes, cfg), parse_run_config(cfg), tmp_path)
    # Assert: the attackers' updates were sent at 0.99 x the norm cap the guards then applied,
    # so the cap clipped neither and nothing was rejected; each sits on the honest cone
    (round_1,) = [r for r in read_rounds(tmp_path) if r["round"] == 1 and "attack" in r]
    entry = round_1["attack"]
    assert len(entry["clients"]) == 2 and entry["honest"] == 2
    assert entry["norms"] == pytest.approx([0.99 * round_1["norm_cap"]] * 2, rel=1e-5)
    assert not set(entry["clients"]) & set(round_1.get("capped", {}))
    assert round_1.get("rejected", {}) == {}
    assert all(after >= entry["least_cosine"] - 1e-9 for after in entry["cosines_after"])
