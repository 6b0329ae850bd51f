"""The network a coalition game runs its forwards through, and an exact faster CPU form of it.

On a CPU most of a LeNet forward is not the convolutions but torch's ``max_pool2d``: its
kernel for NCHW inputs is a scalar loop that also writes argmax indices. Measured here (one
torch thread, 600 MNIST-shaped images): the two pools of LeNet take about half of the forward.
A non-overlapping pool (kernel = stride, no padding or dilation, sides divisible by the kernel)
is the elementwise maximum of kernel^2 strided views, which torch vectorises; and because ReLU
and max are both monotone, ``max_pool(relu(h)) == relu(max_pool(h))`` exactly, so the ReLU can
run on the pooled, 4x smaller tensor. Both rewrites choose the same element as torch's own
pool, so every logit is bit-identical to the eager model (tested), and they apply to any model
``torch.fx`` can trace. Pools that do not fit the pattern fall back to ``F.max_pool2d``.

Measured on this project's 2-core machine (LeNet, 600 images, 1 thread, CPU seconds, same
process): eager forward 1.00, rewritten 0.53-0.59 at batch 256, 0.47-0.51 at batch 128
(eager at 128: 0.95); ``torch.compile`` of the same forward 0.66 after a 60-75 s compile, also
bit-identical. ResNet-18 (CIFAR variant) has no max-pool: the rewrite leaves it as it is
(``torch.compile`` gave 0.88 there, with logits off by 2e-8).
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)
FORWARDS = ("auto", "eager", "rewrite")
Size = int | tuple[int, ...] | list[int]


def _single(value: Size | None) -> int | None:
    """``k`` for ``k`` or ``(k, k)``; None for anything else (a non-square window)."""
    if isinstance(value, int):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and value[0] == value[1]:
        return int(value[0])
    return None


def exact_max_pool2d(x: torch.Tensor, kernel_size: Size, stride: Size | None = None,
                     padding: Size = 0, dilation: Size = 1, ceil_mode: bool = False,
                     return_indices: bool = False) -> torch.Tensor:
    """``F.max_pool2d`` with the same result; non-overlapping windows as strided maxima.

    ``return_indices`` is accepted only as False (such pools are not rewritten)."""
    if return_indices:
        raise ValueError("exact_max_pool2d does not return indices; leave such pools as they are")
    k = _single(kernel_size)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _single(stride)
    fits = (k is not None and s == k and _single(padding) == 0 and _single(dilation) == 1
            and not ceil_mode and x.dim() == 4
            and x.shape[2] % k == 0 and x.shape[3] % k == 0)
    if not fits:
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode)
    assert k is not None
    out = x[:, :, 0::k, 0::k]
    for i in range(k):
        for j in range(k):
            if i or j:
                out = torch.maximum(out, x[:, :, i::k, j::k])
    return out


def relu_then_pool(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    """``max_pool2d(relu(x))`` computed as ``relu(max_pool2d(x))`` (identical: both monotone)."""
    return F.relu(exact_max_pool2d(x, *args, **kwargs))  # type: ignore[arg-type]


def _is_relu(node: fx.Node, gm: fx.GraphModule) -> bool:
    if node.op == "call_function" and node.target in (F.relu, torch.relu):
        return not node.kwargs.get("inplace", False)
    if node.op == "call_module" and isinstance(node.target, str):
        mod = gm.get_submodule(node.target)
        return isinstance(mod, nn.ReLU) and not mod.inplace
    return False


def _pool_args(node: fx.Node, gm: fx.GraphModule) -> tuple[tuple, dict] | None:
    """(args after the input, kwargs) of a 2-D max-pool node returning no indices, or None."""
    if node.op == "call_function" and node.target in (F.max_pool2d, torch.max_pool2d):
        if node.kwargs.get("return_indices") or (len(node.args) > 6 and node.args[6]):
            return None
        return tuple(node.args[1:]), dict(node.kwargs)
    if node.op == "call_module" and isinstance(node.target, str):
        mod = gm.get_submodule(node.target)
        if isinstance(mod, nn.MaxPool2d) and not mod.return_indices:
            return (mod.kernel_size, mod.stride, mod.padding, mod.dilation), {
                "ceil_mode": mod.ceil_mode, "return_indices": mod.return_indices}
    return None


def rewrite_pools(model: nn.Module) -> tuple[fx.GraphModule, int]:
    """``model`` traced with every 2-D max-pool replaced by :func:`exact_max_pool2d` (and a
    ReLU feeding only that pool moved after it); returns the module and the pools rewritten.

    Raises whatever ``torch.fx.symbolic_trace`` raises for an untraceable model.
    """
    gm = fx.symbolic_trace(model)
    rewritten = 0
    for node in list(gm.graph.nodes):
        found = _pool_args(node, gm)
        if found is None:
            continue
        args, kwargs = found
        src = node.args[0]
        assert isinstance(src, fx.Node)
        target = exact_max_pool2d
        if _is_relu(src, gm) and len(src.users) == 1:
            target, src = relu_then_pool, src.args[0]
        with gm.graph.inserting_after(node):
            new = gm.graph.call_function(target, (src, *args), kwargs)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        rewritten += 1
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    gm.delete_all_unused_submodules()
    return gm, rewritten


def prepare_net(model: nn.Module, device: torch.device, forward: str = "auto") -> nn.Module:
    """A copy of ``model`` on ``device`` in eval mode, in the form its forwards should run in.

    ``forward``: ``eager`` the model as it is; ``rewrite`` :func:`rewrite_pools` (an error if
    the model cannot be traced); ``auto`` the rewrite on the CPU where it traces and changes
    at least one pool, else eager (on CUDA torch's pool is fast and the model stays as it is).
    The state-dict keys of the result are the model's.
    """
    if forward not in FORWARDS:
        raise ValueError(f"forward={forward!r} must be one of {FORWARDS}")
    net = copy.deepcopy(model)
    if forward == "rewrite" or (forward == "auto" and device.type == "cpu"):
        try:
            gm, count = rewrite_pools(net)
        except Exception as err:  # torch.fx raises many types for untraceable code
            if forward == "rewrite":
                raise ValueError(f"forward='rewrite': torch.fx cannot trace "
                                 f"{type(model).__name__} ({err}); use forward='eager'") from err
            logger.info("forward: %s not traceable (%s); eager forwards", type(model).__name__,
                        err)
        else:
            same_keys = set(gm.state_dict()) == set(net.state_dict())
            if forward == "rewrite" and not same_keys:
                raise ValueError(f"forward='rewrite': the traced {type(model).__name__} lost "
                                 "state entries its forward never uses; use forward='eager'")
            if same_keys and (count or forward == "rewrite"):
                net = gm
    return net.to(device).eval()


#: The memory formats a coalition's forwards may run in (:func:`choose_memory_format`).
MEMORY_FORMATS = ("auto", "contiguous", "channels-last")
#: Floating entries from which ``memory_format="auto"`` runs a CPU coalition's forwards in
#: channels-last. Measured (issue 71, 2-core AMD EPYC, one torch thread, same process, load
#: 3-4): ResNet-18 0.79-0.87x the contiguous time on 128 CIFAR images (GroupNorm and
#: BatchNorm alike), LeNet 1.09x and the small CNN 1.06x (their stems have 6 channels and run
#: through the pool rewrite); the split sits between 62k and 11.2M entries, as
#: ``VMAP_MAX_PARAMS`` does.
CHANNELS_LAST_MIN_PARAMS = 1_000_000


def choose_memory_format(memory_format: str, device: torch.device, mode: str, n_params: int,
                         x: torch.Tensor) -> torch.memory_format:
    """The memory format of a game's coalition forwards: ``contiguous`` or ``channels-last``
    as told (channels-last needs image batches and loop mode); ``auto``: channels-last for
    image batches in loop mode on the CPU when the model has at least
    :data:`CHANNELS_LAST_MIN_PARAMS` floating entries, else contiguous.

    Channels-last runs other convolution kernels: logits move in their last bits (on 128
    random CIFAR-shaped images, untrained weights: up to 3e-8 for ResNet-18, 1.5e-6 for
    ``resnet18-gn``), so a game's values move by float32 rounding (tests/test_utility_savings.py
    bounds it at 1e-6 of the utility on LeNet; tests/test_utility.py holds ResNet-18's loop
    mode, channels-last by ``auto``, within 1e-5 of the naive contiguous reference, and its
    accuracy equal); a coalition's value still depends on its
    parameters alone, so equal parameters (a null player's) give equal bits.
    """
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(f"memory_format={memory_format!r} must be one of {MEMORY_FORMATS}")
    if memory_format == "channels-last" and (x.dim() != 4 or mode != "loop"):
        raise ValueError(f"memory_format='channels-last' needs 4-D image batches in loop mode "
                         f"(got {x.dim()}-D inputs, mode={mode!r}); use 'contiguous' or 'auto'")
    last = memory_format == "channels-last" or (
        memory_format == "auto" and device.type == "cpu" and mode == "loop" and x.dim() == 4
        and n_params >= CHANNELS_LAST_MIN_PARAMS)
    return torch.channels_last if last else torch.contiguous_format


def in_memory_format(params: dict[str, torch.Tensor], memory_format: torch.memory_format
                     ) -> dict[str, torch.Tensor]:
    """``params`` with every 4-D entry (a convolution's weight) in ``memory_format``: a copy
    for channels-last, the same views for contiguous."""
    if memory_format == torch.contiguous_format:
        return params
    return {k: v.contiguous(memory_format=memory_format) if v.dim() == 4 else v
            for k, v in params.items()}
