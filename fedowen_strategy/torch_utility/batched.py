"""Batched coalition utility: nu(S) = metric of the num-examples-weighted average of S's models.

A coalition's model is a linear combination of the client models, so all coalition parameters
are one matrix product ``A @ W``: ``A`` (k, n+1) holds each coalition's averaging weights (rows
sum to 1), ``W`` (n+1, P) the flattened client states, stacked once, with the current global
state as the last row (the empty coalition's model). No model is rebuilt and no state dict
is loaded per coalition; forward passes go through ``torch.func.functional_call``.

* ``mode="vmap"``: a chunk of coalitions is evaluated in one stacked forward with
  ``torch.func.vmap`` (for small models on a GPU, where one launch for many models pays).
* ``mode="loop"``: one forward per coalition (the CPU, and large models on a GPU). On the CPU
  the forward runs through an exactly equivalent rewrite of the model's max-pools
  (:mod:`.forward`, ``forward="auto"``): 0.47-0.59x the time of a plain LeNet forward, every
  logit bit-identical.
* ``mode="auto"``: loop on the CPU; on CUDA vmap for models of at most ``VMAP_MAX_PARAMS``
  floating entries, else loop (issue 13, H100, n = 10, 40 coalitions: LeNet's 62k entries
  vmapped took 0.35x of 40 plain forwards, ResNet-18's 11.2M took 0.55 s vmapped against
  0.33 s looped).

Nothing after the first layer is linear in the weights (ReLU, pooling, BatchNorm's
``1/sqrt(var)``), so on a CPU a coalition costs one forward of the whole network; reusing the
first layer's output (a stem cache, removed) cost as much as recomputing it (LeNet, n = 5 and
10, 1 thread: 1.04x and 1.03x the time without it).

Integer buffers (BatchNorm's ``num_batches_tracked``) are not averaged: they only count
training steps and do not affect an eval-mode forward. The batched utility keeps the global
state's; the naive reference takes the max over the coalition. BatchNorm runs in eval mode with
the linearly averaged running statistics.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from fedowen_strategy.round.contribution import DEFAULT_UTILITY_METRIC
from fedowen_strategy.torch_utility.coalitions import (
    METRICS,
    MODES,
    Layout,
    _check_args,
    check_states,
    coalition_coefficients,
    delta_params,
    load_numpy_state,
    resolve_device,
    score_sum,
    stack_states,
)
from fedowen_strategy.torch_utility.forward import (
    choose_memory_format,
    in_memory_format,
    prepare_net,
)
from fedowen_strategy.torch_utility.gradient import first_order_terms
from fedowen_strategy.torch_utility.memory import (
    activation_bytes,
    chunk_from_memory,
    memory_budget,
)
from fedowen_strategy.torch_utility.workers import replicas, thread_pool
from fedowen_strategy.valuation._base import check_masks

__all__ = ["METRICS", "MODES", "VMAP_MAX_PARAMS", "CoalitionGame", "Layout", "check_masks",
           "check_states", "choose_mode", "coalition_coefficients", "delta_params",
           "load_numpy_state", "resolve_device", "score_sum", "stack_states"]
logger = logging.getLogger(__name__)
VMAP_MAX_PARAMS = 1_000_000



def gradient_net(net: nn.Module, model: nn.Module, device: torch.device) -> nn.Module:
    """The network for backward passes: ``net`` (the forwards' own) unless it is the pool
    rewrite (:mod:`.forward`), whose strided maxima make exact, fast forwards but a slow
    backward (LeNet, 600 images, one thread: a gradient 1.3-1.7x the eager model's); then
    ``model`` as it is, eager. Both compute the same function: terms move by float rounding."""
    if isinstance(net, torch.fx.GraphModule):
        return prepare_net(model, device, "eager")
    return net


def choose_mode(mode: str, device: torch.device, n_params: int) -> str:
    """``auto`` -> loop on the CPU; on CUDA vmap up to ``VMAP_MAX_PARAMS`` entries, else loop."""
    if mode != "auto":
        return mode
    return "vmap" if device.type == "cuda" and n_params <= VMAP_MAX_PARAMS else "loop"


class CoalitionGame:
    """Batched coalition utility nu(S) of one round, for Shapley-value estimators.

    Parameters
    ----------
    model : nn.Module
        Architecture template (copied; the original is not modified).
    global_state : Mapping[str, np.ndarray]
        Current global model; the empty coalition's value is its metric.
    client_states : Sequence[Mapping[str, np.ndarray]]
        The n clients' returned states (parameters and buffers).
    num_examples : Sequence[int]
        Each client's number of training examples (> 0): the averaging weights.
    x_eval, y_eval : torch.Tensor
        Server-held evaluation set.
    metric : {"accuracy", "neg-loss"}
        Accuracy, or minus the mean cross-entropy.
    device : str, torch.device or None
        ``None``: CUDA when available, else CPU.
    batch_size : int or None
        Evaluation images per forward (per coalition); ``None``: 128 on the CPU (fastest of
        32-600 for LeNet with the rewritten forward: 0.89x the time at 256), else 256.
    chunk_size : int or None
        Coalitions evaluated together; ``None``: from memory (:mod:`.memory`).
    mode : {"auto", "vmap", "loop"}
        See the module docstring.
    memory_cap_bytes : int
        Upper bound on one chunk's memory (coalition parameters and, with vmap, activations).
    forward : {"auto", "eager", "rewrite"}
        The form of the network the forwards run through (:func:`.forward.prepare_net`).
    memory_format : {"auto", "contiguous", "channels-last"}
        The layout of the loop-mode forwards (:func:`.forward.choose_memory_format`; auto:
        channels-last for models of 1M entries or more on the CPU, ResNet-18).
    shares : Sequence[float] or None
        None: the average game (a coalition's model is the num-examples average of its
        members'). Shares ``p`` (summing to 1): the delta game, ``global + sum_{i in S} p_i
        delta_i`` (see :func:`coalition_coefficients`).
    net : nn.Module or None
        A network from :func:`.forward.prepare_net` on ``device`` to reuse (the factory keeps
        one per run instead of tracing the model every round); None: prepared here.
    free_memory_bytes : int or None
        Overrides the measured free memory in the chunk rule (tests use a fake figure).
    workers : int
        Threads that evaluate a chunk's coalitions in loop mode, each on its own copy of the
        network (:mod:`.workers`; 1: the calling thread alone). Every coalition's forwards and
        score sums are the same operations in the same order whichever thread runs them, so the
        values are bit-identical to one worker's (``tests/test_valuation_workers.py``); torch
        releases the GIL in its kernels, so with one torch thread each they run on as many
        cores.
    """

    def __init__(
        self,
        model: nn.Module,
        global_state: Mapping[str, np.ndarray],
        client_states: Sequence[Mapping[str, np.ndarray]],
        num_examples: Sequence[int],
        x_eval: torch.Tensor,
        y_eval: torch.Tensor,
        *,
        metric: str = DEFAULT_UTILITY_METRIC,
        device: str | torch.device | None = None,
        batch_size: int | None = None,
        chunk_size: int | None = None,
        mode: str = "auto",
        memory_cap_bytes: int = 2 * 2**30,
        forward: str = "auto",
        shares: Sequence[float] | None = None,
        net: nn.Module | None = None,
        free_memory_bytes: int | None = None,
        workers: int = 1,
        memory_format: str = "auto",
        grad_net: nn.Module | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers={workers!r} must be >= 1 (threads evaluating coalitions)")
        self.device = resolve_device(device)
        self.batch_size = batch_size or (128 if self.device.type == "cpu" else 256)
        _check_args(metric, mode, x_eval, y_eval, self.batch_size)
        reference = model.state_dict()
        check_states(reference, global_state, client_states, num_examples)
        self.n = len(client_states)
        self.metric = metric
        self.num_examples = [int(m) for m in num_examples]
        self.shares = None if shares is None else [float(x) for x in shares]
        coalition_coefficients(np.ones((1, self.n), bool), self.num_examples, self.shares)
        self.n_model_evals = 0
        self.n_backward = 0
        self._cache: dict[bytes, float] = {}
        self._first_order: dict[float, np.ndarray] = {}

        self._net = prepare_net(model, self.device, forward) if net is None else net
        self._model, self._grad_net = model, grad_net  # the backward passes' (gradient_net)
        load_numpy_state(self._net, global_state)  # integer buffers stay the global's
        self._layout, self._stacked = stack_states(
            reference, [*client_states, global_state], self.device
        )
        self.mode = choose_mode(mode, self.device, self._stacked.shape[1])
        self.workers = workers if self.mode == "loop" else 1
        dtype = self._stacked.dtype
        self._x = x_eval.to(self.device, dtype)
        self._y = y_eval.to(self.device, torch.long)
        self.memory_format = choose_memory_format(memory_format, self.device, self.mode,
                                                  self._stacked.shape[1], self._x)
        self._x_forward = self._x.contiguous(memory_format=self.memory_format)
        # The delta game's coalitions are global + sum p_i (W_i - global), where a zero delta
        # adds exactly nothing: such players are exact null players, and a coalition with them
        # has the parameters of the one without, bit for bit (the cache's key leaves them out)
        self._deltas = (self._stacked[: self.n] - self._stacked[self.n]
                        if self.shares is not None else None)
        self._zero = (np.zeros(self.n, dtype=bool) if self._deltas is None
                      else ~self._deltas.ne(0).any(dim=1).cpu().numpy())
        self.chunk_size = chunk_size or self._chunk_from_memory(memory_cap_bytes,
                                                                free_memory_bytes)
        rewritten = isinstance(self._net, torch.fx.GraphModule)
        info = (self.n, self._stacked.shape[1], len(self._x), metric, self.device, self.mode,
                "rewrite" if rewritten else "eager", self.memory_format, self.batch_size,
                self.chunk_size)
        logger.info("CoalitionGame: n=%d, P=%d, eval=%d, metric=%s, device=%s, mode=%s, "
                    "forward=%s, %s, batch=%d, chunk=%d", *info)

    def _chunk_from_memory(self, cap: int, free_bytes: int | None) -> int:
        """Coalitions per chunk from the memory budget (:func:`.memory.chunk_from_memory`)."""
        params = self._params(self._stacked[self.n : self.n + 1])
        one = {key: v[0] for key, v in params.items()}
        act = activation_bytes(lambda x: functional_call(self._net, one, (x,)), self._x[:1])
        budget = memory_budget(self.device, cap, free_bytes)
        row = self._stacked.shape[1] * self._stacked.element_size()
        return chunk_from_memory(budget, row, act * min(self.batch_size, len(self._x)),
                                 self.mode)

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        """Utilities of the coalitions in ``masks`` (bool, (k, n)) as float64 (k,); each
        distinct coalition, players with a zero update left out, evaluated once per game
        (``n_model_evals`` counts those forwards; an estimator's budget still charges every
        coalition it asks for, so what it plans, and phi, do not depend on this cache)."""
        masks = check_masks(masks, self.n) & ~self._zero
        keys = [row.tobytes() for row in masks]
        todo = {key: i for i, key in enumerate(keys) if key not in self._cache}
        if todo:
            values = self._evaluate(masks[list(todo.values())])
            self._cache.update(zip(todo, values.tolist(), strict=True))
            self.n_model_evals += len(todo)
        return np.array([self._cache[key] for key in keys], dtype=np.float64)

    def first_order(self, at: float = 0.5) -> np.ndarray:
        """The players' first-order terms ``grad u(theta_0 + at D) . p_i delta_i`` (float64
        ``(n,)``; :mod:`.gradient`): one backward pass over the evaluation set per distinct
        ``at`` (counted in ``n_backward``). Needs the delta game and ``metric="neg-loss"``.

        At ``at = 0`` and ``at = 1`` the pass's forwards score the empty and the grand
        coalition, with the parameters a coalition forward would use, bit for bit: their
        values go to the cache unless a forward already gave them, so a method that takes
        those terms first gets ``nu(empty)`` and ``nu(N)`` at no forward (the eager network's
        float rounding, within 1e-6 of the forward's: tests/test_first_order.py)."""
        if self._deltas is None or self.shares is None:
            raise ValueError("first-order terms are defined for the delta game only (pass "
                             "shares); the average game's coalition model is not linear in "
                             "its members")
        if self.metric != "neg-loss":
            raise ValueError(f"first-order terms need metric='neg-loss', got {self.metric!r} "
                             "(accuracy is piecewise constant: its gradient is zero)")
        key = float(at)
        if not 0.0 <= key <= 1.0:
            raise ValueError(f"at={at!r} must lie in [0, 1] (0: the global model, 1: the "
                             "aggregate)")
        if key not in self._first_order:
            net = self.gradient_net()
            buffers = {name for name, _ in net.named_buffers()}

            def forward(theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
                # buffers (BatchNorm's running statistics) are not differentiated: they enter
                # the eval-mode forward as constants at theta, so their terms are 0
                one = {k: v[0].detach() if k in buffers else v[0]
                       for k, v in self._params(theta[None]).items()}
                return functional_call(net, one, (x,))

            end = {0.0: np.zeros(self.n, bool), 1.0: ~self._zero}.get(key)
            theta = (self._end_params(end) if end is not None else self._stacked[self.n]
                     + key * (torch.as_tensor(self.shares, dtype=self._deltas.dtype,
                                              device=self.device) @ self._deltas))
            self._first_order[key], value = first_order_terms(
                forward, theta, self._deltas, np.asarray(self.shares), self._x, self._y,
                self.batch_size)
            self.n_backward += 1
            if end is not None:
                self._cache.setdefault(end.tobytes(), value)
        return self._first_order[key].copy()

    def _end_params(self, mask: np.ndarray) -> torch.Tensor:
        """The flattened parameters ``_evaluate`` builds for the coalition ``mask`` (P,)."""
        assert self._deltas is not None
        coef = torch.from_numpy(coalition_coefficients(mask[None], self.num_examples,
                                                       self.shares))
        return delta_params(self._stacked[self.n], self._deltas,
                            coef.to(self.device, self._stacked.dtype))[0]

    def gradient_net(self) -> nn.Module:
        """The network the first-order terms' backward passes run through (:func:`gradient_net`;
        built on the first call unless given as ``grad_net``)."""
        if self._grad_net is None:
            self._grad_net = gradient_net(self._net, self._model, self.device)
        return self._grad_net

    def _params(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split flattened parameters (c, P) into views keyed like the model's state dict."""
        out, offset = {}, 0
        for key, numel, shape in self._layout:
            out[key] = theta[:, offset : offset + numel].view(-1, *shape)
            offset += numel
        return out

    @torch.inference_mode()
    def _evaluate(self, masks: np.ndarray) -> np.ndarray:
        coef = torch.from_numpy(coalition_coefficients(masks, self.num_examples, self.shares))
        coef = coef.to(self.device, self._stacked.dtype)
        sums = []
        for s in range(0, len(coef), self.chunk_size):
            a = coef[s : s + self.chunk_size]
            if self._deltas is None:
                theta = a @ self._stacked
            else:  # every row sums its members' terms in client order
                theta = delta_params(self._stacked[self.n], self._deltas, a)
            params = self._params(theta)
            sums.append(self._sums_vmap(params) if self.mode == "vmap"
                        else self._sums_loop(params))
        total = torch.cat(sums).cpu().numpy()
        return total / len(self._x)

    def _sums_vmap(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        forward = vmap(lambda p, x: functional_call(self._net, p, (x,)), in_dims=(0, None))
        c = next(iter(params.values())).shape[0]
        out = torch.zeros(c, dtype=torch.float64, device=self.device)
        for s in range(0, len(self._x), self.batch_size):
            logits = forward(params, self._x[s : s + self.batch_size])
            out += score_sum(logits, self._y[s : s + self.batch_size], self.metric)
        return out

    def _sums_loop(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        c = next(iter(params.values())).shape[0]
        if self.workers == 1 or c == 1:
            return self._sums_block(params, self._net, range(c))
        blocks = [range(int(b[0]), int(b[-1]) + 1)
                  for b in np.array_split(np.arange(c), min(self.workers, c))]
        nets = replicas(self._net, len(blocks))

        def run(job: tuple[nn.Module, range]) -> torch.Tensor:
            with torch.inference_mode():  # thread-local: the worker needs its own
                return self._sums_block(params, *job)

        pool = thread_pool(len(blocks))
        return torch.cat(list(pool.map(run, zip(nets, blocks, strict=True))))

    def _sums_block(self, params: dict[str, torch.Tensor], net: nn.Module,
                    block: range) -> torch.Tensor:
        """Score sums of the coalitions ``block`` of ``params``, one forward per batch."""
        out = torch.zeros(len(block), dtype=torch.float64, device=self.device)
        for i, j in enumerate(block):
            p = in_memory_format({key: v[j] for key, v in params.items()}, self.memory_format)
            for s in range(0, len(self._x), self.batch_size):
                logits = functional_call(net, p, (self._x_forward[s : s + self.batch_size],))
                out[i] += score_sum(logits, self._y[s : s + self.batch_size], self.metric)
        return out
