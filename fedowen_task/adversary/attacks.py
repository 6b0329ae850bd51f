"""The table of simulated attacks: one row per ``adversary-kind``.

A row says what the attack does on each side and how its clients behave:

- ``data``: poisons the partition before training (:data:`~fedowen_task.adversary.client.
  DataAttack`);
- ``reply``: what the client returns instead of its trained model (:data:`~fedowen_task.
  adversary.client.ClientAttack`; none: the trained model, as an honest client);
- ``server``: the omniscient part, applied by the ServerApp at the message boundary to the
  round's honest updates (:data:`~fedowen_task.adversary.server.ServerAttack`);
- ``idle``: the client returns without training (nothing to measure or to send);
- ``sybil``: the clients are copies of one actor: they train on the data of the group's first
  partition with its seed (:func:`~fedowen_task.adversary.client.sybil_master`);
- ``mask``: the coordinates the local steps may move (:data:`GradientMask`; none: all), each
  step's gradient zeroed elsewhere while the client trains (:meth:`Attack.training`);
- ``backdoor``: a backdoor: every round records its attack success on the test set, stamped
  with the whole trigger (:func:`measured_trigger`);
- ``shapes``: the ``adversary-trigger`` shapes the attack works with (none: any).

The run-config check (``adversary-kind``), the ClientApp, the ServerApp, ``adversaries.json``
and the reports read this table only. Adding an attack is one row here and its function(s)
in :mod:`~fedowen_task.adversary.client` or :mod:`~fedowen_task.adversary.server`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from fedowen_task.adversary import client, neurotoxin, server
from fedowen_task.adversary.client import ClientAttack, ClientTurn, DataAttack, TorchState
from fedowen_task.adversary.keys import AdversaryConfig, Trigger
from fedowen_task.adversary.server import ServerAttack

#: The coordinates the local steps may move, per parameter (True: free), or None for all:
#: ``(model, global_state, x, y, turn) -> mask``, from the client's clean data.
GradientMask = Callable[[torch.nn.Module, TorchState, torch.Tensor, torch.Tensor, ClientTurn],
                        dict[str, torch.Tensor] | None]


@dataclass(frozen=True)
class Attack:
    """One row of :data:`ATTACKS` (see the module docstring)."""

    data: DataAttack | None = None
    reply: ClientAttack | None = None
    server: ServerAttack | None = None
    idle: bool = False
    sybil: bool = False
    mask: GradientMask | None = None
    backdoor: bool = False
    shapes: tuple[str, ...] = ()

    def client_reply(self, global_state: TorchState, trained: TorchState, turn: ClientTurn
                     ) -> dict[str, torch.Tensor]:
        """What the client returns: ``reply``'s state, else its trained model (server-side
        attacks reply as honest clients and are replaced in the ServerApp)."""
        if self.reply is None:
            return dict(trained)
        return self.reply(global_state, trained, turn)

    @contextmanager
    def training(self, model: torch.nn.Module, global_state: TorchState, x: torch.Tensor,
                 y: torch.Tensor, turn: ClientTurn) -> Iterator[None]:
        """Open while the client poisons its data and trains: ``mask``'s gradient mask on
        ``model``, worked out on entry from the clean ``(x, y)``
        (:func:`fedowen_task.adversary.neurotoxin.masked_gradients`); nothing without one."""
        mask = self.mask(model, global_state, x, y, turn) if self.mask is not None else None
        with neurotoxin.masked_gradients(model, mask):
            yield


#: ``adversary-kind`` -> its row, in the order the docs list them.
ATTACKS: dict[str, Attack] = {
    "label-flip": Attack(data=client.flipped),
    "noise": Attack(reply=client.noise, idle=True),
    "free-rider": Attack(reply=client.free_rider, idle=True),
    "sybil": Attack(sybil=True),
    "disguised-free-rider": Attack(reply=client.disguised),
    "replay-free-rider": Attack(reply=client.replay, idle=True),
    "colluding-sybil": Attack(reply=client.colluding, sybil=True),
    "boosted": Attack(reply=client.boosted),
    "sign-flip": Attack(reply=client.sign_flip),
    "alie": Attack(server=server.alie),
    "ipm": Attack(server=server.ipm),
    "adaptive": Attack(server=server.adaptive),
    "backdoor": Attack(data=client.backdoored, reply=client.boosted, backdoor=True),
    "dba": Attack(data=client.distributed, reply=client.boosted, backdoor=True,
                  shapes=("bars",)),
    "neurotoxin": Attack(data=client.backdoored, reply=neurotoxin.reply,
                         mask=neurotoxin.training_mask, backdoor=True),
    "adaptive-backdoor": Attack(data=client.backdoored, server=server.adaptive_backdoor,
                                backdoor=True),
    "huge-statistics": Attack(reply=client.huge),
    "scaled-statistics": Attack(reply=client.scaled),
}


def kinds() -> tuple[str, ...]:
    """The valid ``adversary-kind`` values."""
    return tuple(ATTACKS)


def server_side() -> tuple[str, ...]:
    """The kinds the ServerApp carries out (:mod:`fedowen_task.adversary.server`)."""
    return tuple(kind for kind, row in ATTACKS.items() if row.server is not None)


def attack_of(cfg: AdversaryConfig) -> Attack:
    """The run's row.

    Raises
    ------
    ValueError
        When ``cfg.kind`` is not in the table.
    """
    row = ATTACKS.get(cfg.kind)
    if row is None:
        raise ValueError(f"adversary-kind={cfg.kind!r} is not one of {', '.join(ATTACKS)}")
    return row


def trigger_problems(kind: str, shape: str) -> list[str]:
    """Why ``adversary-trigger`` does not suit ``adversary-kind``'s row (its ``shapes``);
    empty when it does, or when the kind is unknown (that is the kind's problem)."""
    row = ATTACKS.get(kind)
    if row is None or not row.shapes or shape in row.shapes:
        return []
    return [f"adversary-kind={kind!r} works with adversary-trigger {' | '.join(row.shapes)} "
            f"only, got {shape!r}: set adversary-trigger={row.shapes[0]!r}"]


def measured_trigger(cfg: AdversaryConfig) -> Trigger | None:
    """The trigger a run's attack success is measured with: the whole trigger of a backdoor
    row (DBA's global pattern, not a part), None when the run has no backdoor."""
    if not cfg.active or not attack_of(cfg).backdoor:
        return None
    return cfg.backdoor()


def adversaries_record(cfg: AdversaryConfig, num_partitions: int) -> dict[str, Any]:
    """``adversaries.json``: :meth:`AdversaryConfig.record` and whether the ServerApp carries
    the attack out (``server_side``)."""
    return {**cfg.record(num_partitions), "server_side": attack_of(cfg).server is not None}
