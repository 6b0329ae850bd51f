"""Adversarial clients for robustness experiments (simulation only).

A seeded fraction of the partitions misbehaves in one of these ways (``adversary-kind``):

- ``label-flip``: trains honestly on labels mapped ``y -> C - 1 - y`` (a poisoned update);
- ``noise``: returns the global model plus i.i.d. Gaussian noise of std ``noise_std`` instead
  of a trained update (a random update);
- ``free-rider``: returns the global model unchanged while claiming its examples (no work);
- ``sybil``: one actor behind many identities: every adversary trains on the data of the
  group's first partition with that partition's seed, so whenever two of them are selected in
  one round they return copies of one update (each under its own client id);
- ``disguised-free-rider`` (Fraboni et al., AISTATS 2021): returns the global model plus
  Gaussian noise whose norm equals an honest update's. The client trains honestly only to
  *measure* that norm (the strongest disguise: a real free rider must guess it, e.g. from the
  last global update) and reports its honest training loss, then discards the training;
- ``replay-free-rider`` (ibid.): returns ``global_t + (global_t - global_s) / (t - s)``,
  ``s`` being the last round it was sent a model (kept in its context state): the last global
  update it saw, per round. It does no training; in the first round it takes part it has no
  earlier model and returns the global model unchanged (a plain free rider);
- ``colluding-sybil``: as ``sybil`` (one actor's update), but every copy adds Gaussian noise
  of norm ``adversary-sybil-noise`` x the update's norm, seeded by the copy's own client id,
  so copies are not exact duplicates (0.1 puts two copies about 0.14 x the norm apart,
  far beyond ``duplicate-tolerance``, default 1e-6);
- ``boosted``: trains honestly and scales its update by ``adversary-boost``. It is meant to
  sit just under the bound in force, but a client cannot know the others' norms: FedOwen's
  ``update-bound`` allows 3 x the round's lower-median norm *per example* x n_i, so a client
  whose own norm per example is typical passes with any factor below 3. The default 2.5
  leaves room for a client 20% above the median (measured honest per-example norms spread
  2.2x, :mod:`fedowen_strategy.bounds`);
- ``sign-flip``: trains honestly and returns ``global - (trained - global)``: the honest
  update reversed (the sign-flipping attack of Byzantine-robustness benchmarks such as
  Blades and ByzFL);
- ``alie``, ``ipm``, ``adaptive`` (:data:`SERVER_SIDE_KINDS`): omniscient attacks that need the
  round's honest updates ("a little is enough", Baruch et al., NeurIPS 2019; inner-product
  manipulation, Xie et al., UAI 2020; an adaptive booster that sits just under the defence's
  bound). Their clients train and reply as honest ones; the ServerApp replaces their replies
  at the message boundary (:mod:`server_app.byzantine`), so the attacks act the same under
  every strategy and backend.

Which partitions are adversarial is a pure function of (num_partitions, fraction, seed)
(:func:`fedowen_task.partition.adversary_ids`, shared with the ServerApp and the reports), so
whoever reads the records can name them without asking the clients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedowen_task.config import ADVERSARY_KINDS, SERVER_SIDE_KINDS, TaskConfig

KINDS = ADVERSARY_KINDS
#: Kinds that return without training (nothing to measure or to send).
IDLE_KINDS = ("noise", "free-rider", "replay-free-rider")
#: Kinds whose copies share the data and seed of the group's first partition.
SYBIL_KINDS = ("sybil", "colluding-sybil")
State = Mapping[str, torch.Tensor]


def sybil_master(adversaries: frozenset[int]) -> int:
    """The partition whose data and seed every Sybil copies (the smallest adversary id)."""
    if not adversaries:
        raise ValueError("sybil_master needs at least one adversary")
    return min(adversaries)


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``y -> C - 1 - y``: every label moves to another class (for C >= 2)."""
    return (num_classes - 1) - y


def noise_update(global_state: Mapping[str, torch.Tensor], noise_std: float,
                 seed: int) -> dict[str, torch.Tensor]:
    """The global model with Gaussian noise added to every floating tensor."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, value in global_state.items():
        if value.is_floating_point():
            out[key] = value + noise_std * torch.randn(value.shape, generator=gen,
                                                       dtype=value.dtype)
        else:
            out[key] = value.clone()
    return out


def _float_delta(state: State, reference: State) -> dict[str, torch.Tensor]:
    return {k: state[k] - reference[k] for k, v in reference.items() if v.is_floating_point()}


def _norm(tensors: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors.values()))


def _plus(reference: State, delta: Mapping[str, torch.Tensor],
          fallback: State | None = None) -> dict[str, torch.Tensor]:
    """``reference + delta`` on the floating tensors, the others from ``fallback`` (or kept)."""
    other = fallback if fallback is not None else reference
    return {k: (v + delta[k]).to(v.dtype) if k in delta else other[k].clone()
            for k, v in reference.items()}


def _gaussian(shapes: State, norm: float, seed: int) -> dict[str, torch.Tensor]:
    """A Gaussian direction over the floating tensors, scaled to ``norm`` in total."""
    gen = torch.Generator().manual_seed(seed)
    noise = {k: torch.randn(v.shape, generator=gen, dtype=torch.float64)
             for k, v in shapes.items() if v.is_floating_point()}
    scale = norm / max(_norm(noise), 1e-300)
    return {k: (scale * v).to(shapes[k].dtype) for k, v in noise.items()}


def disguised_update(global_state: State, trained: State, seed: int) -> dict[str, torch.Tensor]:
    """The global model plus Gaussian noise whose norm is the honest update's
    ``||trained - global||`` (the training itself is thrown away)."""
    norm = _norm(_float_delta(trained, global_state))
    return _plus(global_state, _gaussian(global_state, norm, seed))


def boosted_update(global_state: State, trained: State, factor: float
                   ) -> dict[str, torch.Tensor]:
    """``global + factor * (trained - global)`` (integer buffers as trained)."""
    delta = {k: factor * d for k, d in _float_delta(trained, global_state).items()}
    return _plus(global_state, delta, trained)


def sign_flipped_update(global_state: State, trained: State) -> dict[str, torch.Tensor]:
    """``global - (trained - global)``: the honest update reversed (integer buffers as
    trained)."""
    return boosted_update(global_state, trained, -1.0)


def colluding_copy(global_state: State, trained: State, relative_noise: float, seed: int
                   ) -> dict[str, torch.Tensor]:
    """``trained`` plus Gaussian noise of norm ``relative_noise * ||trained - global||``."""
    norm = relative_noise * _norm(_float_delta(trained, global_state))
    return _plus(trained, _gaussian(trained, norm, seed))


REPLAY_MODEL, REPLAY_ROUND = "replay-global", "replay-round"


def replay_update(global_state: State, memory: RecordDict, server_round: int
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


def misbehave(kind: str, global_state: State, trained: State, cfg: TaskConfig, *,
              server_round: int, seed: int, attack_seed: int, memory: RecordDict
              ) -> dict[str, torch.Tensor]:
    """What a client of ``kind`` returns, given the global model and its honestly trained
    model (the global model for :data:`IDLE_KINDS`). ``seed`` is the training seed (shared by
    Sybil copies), ``attack_seed`` the client's own; ``memory`` its context state."""
    if kind in ("honest", "label-flip", "sybil", *SERVER_SIDE_KINDS):
        return dict(trained)  # server-side kinds are replaced in the ServerApp
    if kind == "free-rider":
        return {k: v.clone() for k, v in global_state.items()}
    if kind == "noise":
        return noise_update(global_state, cfg.adversary_noise_std, seed)
    if kind == "disguised-free-rider":
        return disguised_update(global_state, trained, attack_seed)
    if kind == "replay-free-rider":
        return replay_update(global_state, memory, server_round)
    if kind == "colluding-sybil":
        return colluding_copy(global_state, trained, cfg.adversary_sybil_noise, attack_seed)
    if kind == "boosted":
        return boosted_update(global_state, trained, cfg.adversary_boost)
    if kind == "sign-flip":
        return sign_flipped_update(global_state, trained)
    raise ValueError(f"adversary-kind={kind!r} is not one of {', '.join(KINDS)}")
