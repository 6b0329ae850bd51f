"""Neurotoxin (Zhang et al., ICML 2022): a backdoor confined to the rarely used coordinates.

The benign clients' updates concentrate on few coordinates; a backdoor planted elsewhere is
not overwritten by them and lasts. The attacker takes the last global change it saw,
``global_t - global_s`` (``s`` the last round it was sent a model, kept in its context
state), as its estimate of the benign update, leaves alone the ``adversary-neurotoxin-top``
share of coordinates of largest ``|change|`` (ranked over every parameter together, as the
reference code's ``aggregate_all_layer = 1``) and trains on its poisoned data with each
step's gradient zeroed there (:func:`masked_gradients`: the paper's projection at every local
step, Algorithm 1, and the reference code's ``apply_grad_mask``). The reply is then put back
on the mask once more (:func:`confine`: weight decay and momentum move no masked coordinate,
but a recipe with weight decay would nudge them; this makes the sent update exactly
confined) and boosted by ``adversary-boost`` like the backdoor's.

An attacker is drawn about one round in ten, so most of its turns are its first, with no
earlier model: then it ranks the reference code's estimate instead (``grad_mask_cv``), the
gradient of its own clean data at the model it was sent (:func:`clean_gradient`). The mask is
worked out before the data is poisoned and kept in the context state until the reply
(:data:`MASK`). Running statistics (BatchNorm) are no coordinates of the gradient; they are
sent as trained.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedowen_task.adversary.client import ClientTurn, TorchState, boosted_update
from fedowen_task.protocol import NORM_STATISTICS

log = logging.getLogger(__name__)

#: The context-state records of the model the attacker was sent last, and its round.
LAST_MODEL, LAST_ROUND = "neurotoxin-global", "neurotoxin-round"
#: The context-state records of this round's mask (1: free) and what it was ranked on.
MASK, MASK_SOURCE = "neurotoxin-mask", "neurotoxin-mask-source"
#: Images a batch when :func:`clean_gradient` sums the loss's gradient.
GRADIENT_BATCH = 256


def coordinates(state: TorchState) -> list[str]:
    """The keys whose coordinates the mask ranks: floating tensors but running statistics."""
    return [k for k, v in state.items() if v.is_floating_point()
            and not k.endswith(NORM_STATISTICS)]


def coordinate_mask(change: TorchState, top: float) -> dict[str, torch.Tensor]:
    """Per key of ``change``, booleans: True where the attacker may move. The
    ``round(top * n)`` coordinates of largest ``|change|`` over all ``n`` of them together are
    False (ties broken by position, so the same change gives the same mask)."""
    if not 0.0 <= top < 1.0:
        raise ValueError(f"adversary-neurotoxin-top={top!r} must lie in [0, 1)")
    names = list(change)
    flat = np.concatenate([change[k].detach().abs().flatten().double().numpy()
                           for k in names]) if names else np.empty(0)
    keep = np.ones(flat.size, dtype=bool)
    excluded = round(top * flat.size)
    if excluded > 0:
        keep[np.argsort(-flat, kind="stable")[:excluded]] = False
    out, start = {}, 0
    for k in names:
        n = change[k].numel()
        out[k] = torch.from_numpy(keep[start:start + n].copy()).view(change[k].shape)
        start += n
    return out


def last_change(global_state: TorchState, memory: RecordDict, server_round: int
                ) -> dict[str, torch.Tensor] | None:
    """``global_t - global_s`` over :func:`coordinates`, from the model kept in ``memory``;
    None without one (or one not older than this round)."""
    if LAST_MODEL not in memory.array_records or LAST_ROUND not in memory.config_records:
        return None
    past_round = memory.config_records[LAST_ROUND]["round"]
    if not isinstance(past_round, int) or past_round >= server_round:
        return None
    past = memory.array_records[LAST_MODEL].to_torch_state_dict()
    return {k: global_state[k] - past[k] for k in coordinates(global_state)}


def clean_gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
                   ) -> dict[str, torch.Tensor]:
    """The gradient of the summed cross-entropy of ``(x, y)`` at ``model``'s weights, per
    parameter (computed on a copy in evaluation mode: the model and its running statistics
    are left as they are)."""
    probe = copy.deepcopy(model).eval()
    probe.zero_grad(set_to_none=True)
    device = next(probe.parameters()).device
    for start in range(0, len(y), GRADIENT_BATCH):
        xb = x[start:start + GRADIENT_BATCH].to(device)
        yb = y[start:start + GRADIENT_BATCH].to(device, dtype=torch.long)
        torch.nn.functional.cross_entropy(probe(xb), yb, reduction="sum").backward()
    return {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu()
            for name, p in probe.named_parameters() if p.requires_grad}


def remember(global_state: TorchState, memory: RecordDict, server_round: int) -> None:
    """Keep this round's global model for the next round's change."""
    memory[LAST_MODEL] = ArrayRecord({k: v.detach().clone() for k, v in global_state.items()})
    memory[LAST_ROUND] = ConfigRecord({"round": server_round})


@contextmanager
def masked_gradients(model: torch.nn.Module, mask: Mapping[str, torch.Tensor] | None
                     ) -> Iterator[None]:
    """While open, every gradient of a parameter named in ``mask`` is multiplied by it (False:
    zero) before the optimiser reads it: the projection at every local step."""
    handles = []
    if mask is not None:
        for name, param in model.named_parameters():
            if name in mask:
                handles.append(param.register_hook(_masker(mask[name])))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _masker(mask: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    cached: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def hook(grad: torch.Tensor) -> torch.Tensor:
        where = (grad.device, grad.dtype)
        if where not in cached:
            cached[where] = mask.to(device=grad.device, dtype=grad.dtype)
        return grad * cached[where]
    return hook


def confine(global_state: TorchState, trained: TorchState,
            mask: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """``trained`` with every masked-off coordinate put back to the global model's (the
    update is exactly zero there); everything else as trained."""
    out = {k: v.clone() for k, v in trained.items()}
    for k, keep in (mask or {}).items():
        out[k] = torch.where(keep, trained[k], global_state[k].to(trained[k].dtype))
    return out


# The table's hooks (fedowen_task.adversary.attacks).

def training_mask(model: torch.nn.Module, global_state: TorchState, x: torch.Tensor,
                  y: torch.Tensor, turn: ClientTurn) -> dict[str, torch.Tensor] | None:
    """``neurotoxin``'s mask for the local steps, from its clean data ``(x, y)`` and the model
    it was sent: :func:`coordinate_mask` of :func:`last_change`, or of :func:`clean_gradient`
    without an earlier model; kept in the context state for :func:`reply` (None at a share
    of 0: nothing left alone)."""
    top = turn.cfg.neurotoxin_top
    if top == 0.0:
        return None
    change = last_change(global_state, turn.memory, turn.server_round)
    source = "global-change"
    if change is None:
        free = set(coordinates(global_state))
        change = {k: v for k, v in clean_gradient(model, x, y).items() if k in free}
        source = "own-gradient"
    mask = coordinate_mask(change, top)
    turn.memory[MASK] = ArrayRecord({k: m.to(torch.uint8) for k, m in mask.items()})
    turn.memory[MASK_SOURCE] = ConfigRecord({"source": source, "round": turn.server_round})
    log.debug("round %d: neurotoxin mask from its %s", turn.server_round, source)
    return mask


def reply(global_state: TorchState, trained: TorchState, turn: ClientTurn
          ) -> dict[str, torch.Tensor]:
    """``neurotoxin``'s reply: the trained model :func:`confine`-d to this round's mask (the
    one :func:`training_mask` kept), its update boosted by ``adversary-boost``; then this
    round's model kept (:func:`remember`) and the mask dropped."""
    mask = None
    if MASK in turn.memory.array_records:
        mask = {k: v.bool() for k, v in turn.memory.array_records[MASK].to_torch_state_dict()
                .items()}
        del turn.memory[MASK]
    out = boosted_update(global_state, confine(global_state, trained, mask), turn.cfg.boost)
    remember(global_state, turn.memory, turn.server_round)
    return out
