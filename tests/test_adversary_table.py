"""Adding an attack is one row of the table (fedowen_task.adversary.attacks.ATTACKS): a
test-only row, registered there alone, reaches the run-config check, the real ClientApp, the
ServerApp's message boundary and the run's adversary records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from numpy.typing import NDArray

from client_app.app import app as client_app
from fedowen_strategy.updates import vector_norm
from fedowen_task.adversary.attacks import ATTACKS, Attack, kinds, server_side
from fedowen_task.adversary.client import ClientTurn, TorchState
from fedowen_task.adversary.keys import AdversaryConfig
from fedowen_task.adversary.server import RoundView
from fedowen_task.config import ConfigError, TaskConfig
from server_app.app import run
from server_app.config import parse_run_config
from server_app.store.records import read_rounds
from sim.inline_grid import InProcessGrid

KIND = "test-marker"
MARK = 0.01  # the client side's update: every floating weight moved by this


def _marked(x: torch.Tensor, y: torch.Tensor, num_classes: int,
            seen: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    seen.append(len(y))
    return x, y


def _marker(global_state: TorchState, trained: TorchState, turn: ClientTurn
            ) -> dict[str, torch.Tensor]:
    """The client side: the global model plus MARK on every floating weight."""
    return {k: v + MARK if v.is_floating_point() else v.clone()
            for k, v in global_state.items()}


def _reverse(view: RoundView, cfg: AdversaryConfig) -> tuple[NDArray, dict[str, Any]]:
    """The server side: each attacker's own update reversed, and what it saw."""
    # measured as the records measure the sent rows (float32 updates summed pairwise): numpy's
    # BLAS norm of the same float32 vector differs from it in the 7th digit
    return -view.own, {"own_norms": [vector_norm(r) for r in view.own],
                       "honest_seen": int(view.honest.shape[0])}


@pytest.fixture
def marker_attack() -> Iterator[list[int]]:
    """The test row, in the table for one test; yields the partition sizes its data hook saw."""
    seen: list[int] = []
    ATTACKS[KIND] = Attack(data=lambda x, y, t: _marked(x, y, t.num_classes, seen), reply=_marker,
                           server=_reverse)
    try:
        yield seen
    finally:
        del ATTACKS[KIND]


def test_one_row_reaches_both_apps_and_the_records(marker_attack: list[int],
                                                   shared_data_dir: Path,
                                                   tmp_path: Path) -> None:
    # Prepare: 2 of 4 clients run the test attack for one round
    assert KIND in kinds() and KIND in server_side()
    run_config = {"dataset": "mnist", "data-dir": str(shared_data_dir),
                  "output-dir": str(tmp_path), "num-server-rounds": 1, "clients-per-round": 4,
                  "client-max-samples": 20, "test-max-samples": 100,
                  "adversary-fraction": 0.5, "adversary-kind": KIND}
    nodes = [{"partition-id": i, "num-partitions": 4} for i in range(4)]
    # Execute: the real ClientApp over the in-process grid, the real ServerApp
    run(InProcessGrid(client_app, nodes, run_config), parse_run_config(run_config), tmp_path)
    # Assert: the run config accepted the kind; the adversaries are recorded with it
    record = json.loads((tmp_path / "adversaries.json").read_text())
    assert record["kind"] == KIND and record["server_side"] is True
    assert len(record["ids"]) == 2
    # the client side ran in the ClientApp: both adversaries' data went through the hook,
    # and the ServerApp saw their marker updates (MARK x sqrt(weights) each) beside the
    # two honest ones
    assert marker_attack == [20, 20]
    (round_1,) = [r for r in read_rounds(tmp_path) if r["round"] == 1]
    entry = round_1["attack"]
    assert entry["kind"] == KIND and sorted(entry["clients"]) == sorted(record["ids"])
    assert entry["honest_seen"] == 2 and entry["replies"] == 4
    from fedowen_task.models import build_model

    weights = sum(v.numel() for v in build_model("lenet", 1, 10).state_dict().values()
                  if v.is_floating_point())
    assert entry["own_norms"] == pytest.approx([MARK * np.sqrt(weights)] * 2, rel=1e-3)
    # the server side's rows were sent: the marker reversed, of the same norm
    assert entry["norms"] == pytest.approx(entry["own_norms"])


def test_without_its_row_the_kind_is_refused(marker_attack: list[int]) -> None:
    # Prepare: the row is registered; take it out as the fixture will
    assert parse_run_config({"adversary-kind": KIND}).adversary().kind == KIND
    row = ATTACKS.pop(KIND)
    try:
        # Execute / Assert: the same run config no longer parses
        with pytest.raises(ConfigError, match="adversary-kind='test-marker' is not one of"):
            parse_run_config({"adversary-kind": KIND})
    finally:
        ATTACKS[KIND] = row


def test_every_adversary_key_is_a_field_of_the_adversary_config() -> None:
    # AdversaryConfig.of reads adversary-<field> for each field but the seed: both ways
    keys = {f.name for f in fields(TaskConfig) if f.name.startswith("adversary_")}
    assert keys == {f"adversary_{f.name}" for f in fields(AdversaryConfig) if f.name != "seed"}
