"""The client side of the attacks: what an adversarial ClientApp trains on and returns.

Each attack of the table (:mod:`fedowen_task.adversary.attacks`) may poison the data before
training (``data``: ``(x, y, turn) -> (x, y)``) and the model after it (``reply``:
``(global_state, trained, turn) -> state``). An attack that returns without training
(``idle``) gets the global model as ``trained``. States here are torch state dicts; floating
tensors are the update, integer buffers counters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedowen_task.adversary.keys import AdversaryConfig
from fedowen_task.protocol import NORM_STATISTICS

#: A torch state dict.
TorchState = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class ClientTurn:
    """What an adversarial client knows when it replies: the run's adversary config, the
    round, its training ``seed`` (shared by Sybil copies), its own ``attack_seed`` and
    ``memory``, its context state (kept across rounds); ``rank``, its place among the
    adversaries in id order (:meth:`~fedowen_task.adversary.keys.AdversaryConfig.rank`)."""

    cfg: AdversaryConfig
    server_round: int
    seed: int
    attack_seed: int
    memory: RecordDict
    num_classes: int = 0
    dataset: str = ""
    #: The dataset's white, standardised (:func:`fedowen_task.data.white`): the backdoor's
    #: trigger colour.
    white: torch.Tensor | None = None
    rank: int = -1


#: Poisons a partition before training: ``(x, y, turn) -> (x, y)``.
DataAttack = Callable[[torch.Tensor, torch.Tensor, "ClientTurn"],
                      tuple[torch.Tensor, torch.Tensor]]
#: What the client returns: ``(global_state, trained, turn) -> state``.
ClientAttack = Callable[[TorchState, TorchState, ClientTurn], dict[str, torch.Tensor]]


def sybil_master(adversaries: frozenset[int]) -> int:
    """The partition whose data and seed every Sybil copies (the smallest adversary id)."""
    if not adversaries:
        raise ValueError("sybil_master needs at least one adversary")
    return min(adversaries)


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``y -> C - 1 - y``: every label moves to another class (for C >= 2)."""
    return (num_classes - 1) - y


def noise_update(global_state: TorchState, noise_std: float, seed: int
                 ) -> dict[str, torch.Tensor]:
    """The global model with Gaussian noise added to every floating tensor but a
    normalisation layer's running statistics (kept: a noisy variance below 0 would only get
    the reply rejected)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, value in global_state.items():
        if value.is_floating_point() and not key.endswith(NORM_STATISTICS):
            out[key] = value + noise_std * torch.randn(value.shape, generator=gen,
                                                       dtype=value.dtype)
        else:
            out[key] = value.clone()
    return out


def _float_delta(state: TorchState, reference: TorchState) -> dict[str, torch.Tensor]:
    return {k: state[k] - reference[k] for k, v in reference.items() if v.is_floating_point()}


def _norm(tensors: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors.values()))


def _plus(reference: TorchState, delta: Mapping[str, torch.Tensor],
          fallback: TorchState | None = None) -> dict[str, torch.Tensor]:
    """``reference + delta`` on the floating tensors, the others from ``fallback`` (or kept)."""
    other = fallback if fallback is not None else reference
    return {k: (v + delta[k]).to(v.dtype) if k in delta else other[k].clone()
            for k, v in reference.items()}


def _gaussian(shapes: TorchState, norm: float, seed: int) -> dict[str, torch.Tensor]:
    """A Gaussian direction over the floating tensors, scaled to ``norm`` in total."""
    gen = torch.Generator().manual_seed(seed)
    noise = {k: torch.randn(v.shape, generator=gen, dtype=torch.float64)
             for k, v in shapes.items() if v.is_floating_point()}
    scale = norm / max(_norm(noise), 1e-300)
    return {k: (scale * v).to(shapes[k].dtype) for k, v in noise.items()}


def disguised_update(global_state: TorchState, trained: TorchState, seed: int
                     ) -> dict[str, torch.Tensor]:
    """The global model plus Gaussian noise whose norm is the honest update's
    ``||trained - global||`` (the training itself is thrown away)."""
    norm = _norm(_float_delta(trained, global_state))
    return _plus(global_state, _gaussian(global_state, norm, seed))


def boosted_update(global_state: TorchState, trained: TorchState, factor: float
                   ) -> dict[str, torch.Tensor]:
    """``global + factor * (trained - global)`` (integer buffers as trained)."""
    delta = {k: factor * d for k, d in _float_delta(trained, global_state).items()}
    return _plus(global_state, delta, trained)


def sign_flipped_update(global_state: TorchState, trained: TorchState
                        ) -> dict[str, torch.Tensor]:
    """``global - (trained - global)``: the honest update reversed (integer buffers as
    trained)."""
    return boosted_update(global_state, trained, -1.0)


def colluding_copy(global_state: TorchState, trained: TorchState, relative_noise: float,
                   seed: int) -> dict[str, torch.Tensor]:
    """``trained`` plus Gaussian noise of norm ``relative_noise * ||trained - global||``."""
    norm = relative_noise * _norm(_float_delta(trained, global_state))
    return _plus(trained, _gaussian(trained, norm, seed))


#: ``huge-statistics``' running statistics: a variance of 1e6 and a mean of 1e3 in every
#: channel, finite and non-negative, so the reply checks pass them.
HUGE_VARIANCE, HUGE_MEAN = 1e6, 1e3


def with_statistics(trained: TorchState, variance: Callable[[torch.Tensor], torch.Tensor],
                    mean: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """``trained`` with every ``*running_var`` through ``variance`` and every
    ``*running_mean`` through ``mean`` (each tensor's dtype kept); everything else, the
    update included, as trained."""
    out = {}
    for key, value in trained.items():
        if key.endswith("running_var"):
            out[key] = variance(value).to(value.dtype)
        elif key.endswith("running_mean"):
            out[key] = mean(value).to(value.dtype)
        else:
            out[key] = value.clone()
    return out


def huge_statistics(trained: TorchState) -> dict[str, torch.Tensor]:
    """``trained`` with every running variance :data:`HUGE_VARIANCE` and every running mean
    :data:`HUGE_MEAN`: valid statistics, honest parameters."""
    return with_statistics(trained, lambda v: torch.full_like(v, HUGE_VARIANCE),
                           lambda m: torch.full_like(m, HUGE_MEAN))


def scaled_statistics(trained: TorchState, factor: float) -> dict[str, torch.Tensor]:
    """``trained`` with its running variances and means multiplied by ``factor`` (> 0: a
    variance stays non-negative), honest parameters."""
    return with_statistics(trained, lambda v: v * factor, lambda m: m * factor)


REPLAY_MODEL, REPLAY_ROUND = "replay-global", "replay-round"


def replay_update(global_state: TorchState, memory: RecordDict, server_round: int
                  ) -> dict[str, torch.Tensor]:
    """``global_t + (global_t - global_s) / (t - s)`` with ``global_s`` the model this client
    was sent last (round ``s < t``, kept in ``memory``, its context state); the global model
    unchanged when it has none. Stores ``global_t`` for the next time."""
    out = {k: v.clone() for k, v in global_state.items()}
    if REPLAY_MODEL in memory.array_records and REPLAY_ROUND in memory.config_records:
        past_round = memory.config_records[REPLAY_ROUND]["round"]
        past = memory.array_records[REPLAY_MODEL].to_torch_state_dict()
        if isinstance(past_round, int) and past_round < server_round:
            delta = _float_delta(global_state, past)
            out = _plus(global_state, {k: d / (server_round - past_round)
                                       for k, d in delta.items()})
    memory[REPLAY_MODEL] = ArrayRecord({k: v.clone() for k, v in global_state.items()})
    memory[REPLAY_ROUND] = ConfigRecord({"round": server_round})
    return out


# The table's hooks: each adapts one attack above to the row's signature.

def flipped(x: torch.Tensor, y: torch.Tensor, turn: ClientTurn
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``label-flip``'s data: the labels flipped (:func:`flip_labels`)."""
    return x, flip_labels(y, turn.num_classes)


def backdoored(x: torch.Tensor, y: torch.Tensor, turn: ClientTurn
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``backdoor``'s data: ``adversary-poison-fraction`` of the images, drawn afresh each
    round by the attack seed, stamped with the trigger and relabelled to the target
    (:func:`fedowen_task.adversary.backdoor.poison`)."""
    return _poisoned(x, y, turn, None)


def distributed(x: torch.Tensor, y: torch.Tensor, turn: ClientTurn
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``dba``'s data: as :func:`backdoored`, but stamped with one bar of the ``bars``
    trigger alone, bar ``rank mod adversary-dba-parts`` (DBA's local trigger)."""
    if turn.rank < 0:
        raise ValueError("adversary-kind='dba' needs the client's rank among the adversaries "
                         "(ClientTurn.rank = AdversaryConfig.rank(partition, partitions))")
    return _poisoned(x, y, turn, turn.rank % turn.cfg.dba_parts)


def _poisoned(x: torch.Tensor, y: torch.Tensor, turn: ClientTurn, part: int | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    from fedowen_task.adversary.backdoor import poison

    trigger = turn.cfg.backdoor()
    if turn.white is None:
        raise ValueError(f"adversary-kind={turn.cfg.kind!r} needs the dataset's white "
                         "(ClientTurn.white = fedowen_task.data.white(dataset))")
    if trigger.target >= turn.num_classes:
        raise ValueError(f"adversary-target={trigger.target} is not a class of "
                         f"{turn.dataset} (0..{turn.num_classes - 1})")
    x, y, _ = poison(x, y, trigger, turn.white, np.random.default_rng(turn.attack_seed), part)
    return x, y


def free_rider(global_state: TorchState, trained: TorchState, turn: ClientTurn
               ) -> dict[str, torch.Tensor]:
    """The global model unchanged."""
    return {k: v.clone() for k, v in global_state.items()}


def noise(global_state: TorchState, trained: TorchState, turn: ClientTurn
          ) -> dict[str, torch.Tensor]:
    """:func:`noise_update` of std ``adversary-noise-std`` (seeded by the training seed)."""
    return noise_update(global_state, turn.cfg.noise_std, turn.seed)


def disguised(global_state: TorchState, trained: TorchState, turn: ClientTurn
              ) -> dict[str, torch.Tensor]:
    """:func:`disguised_update` (seeded by the client's own attack seed)."""
    return disguised_update(global_state, trained, turn.attack_seed)


def replay(global_state: TorchState, trained: TorchState, turn: ClientTurn
           ) -> dict[str, torch.Tensor]:
    """:func:`replay_update` from the client's memory."""
    return replay_update(global_state, turn.memory, turn.server_round)


def colluding(global_state: TorchState, trained: TorchState, turn: ClientTurn
              ) -> dict[str, torch.Tensor]:
    """:func:`colluding_copy` with ``adversary-sybil-noise``."""
    return colluding_copy(global_state, trained, turn.cfg.sybil_noise, turn.attack_seed)


def boosted(global_state: TorchState, trained: TorchState, turn: ClientTurn
            ) -> dict[str, torch.Tensor]:
    """:func:`boosted_update` by ``adversary-boost``."""
    return boosted_update(global_state, trained, turn.cfg.boost)


def sign_flip(global_state: TorchState, trained: TorchState, turn: ClientTurn
              ) -> dict[str, torch.Tensor]:
    """:func:`sign_flipped_update`."""
    return sign_flipped_update(global_state, trained)


def huge(global_state: TorchState, trained: TorchState, turn: ClientTurn
         ) -> dict[str, torch.Tensor]:
    """``huge-statistics``: :func:`huge_statistics` of the honest training."""
    return huge_statistics(trained)


def scaled(global_state: TorchState, trained: TorchState, turn: ClientTurn
           ) -> dict[str, torch.Tensor]:
    """``scaled-statistics``: :func:`scaled_statistics` by ``adversary-statistics-scale``."""
    return scaled_statistics(trained, turn.cfg.statistics_scale)
