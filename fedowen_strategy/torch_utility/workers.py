"""The threads that evaluate a chunk's coalitions in loop mode (``CoalitionGame(workers=k)``).

Each worker thread runs on its own copy of the network: ``functional_call`` swaps a module's
parameters while it runs, so two threads may not share one module. The copies are kept per
network for the next round's game, and one process-wide pool serves each number of threads,
so neither is rebuilt every round.
"""

from __future__ import annotations

import copy
import weakref
from concurrent.futures import ThreadPoolExecutor

from torch import nn

#: Per network, its copies for worker threads.
_REPLICAS: weakref.WeakKeyDictionary[nn.Module, list[nn.Module]] = weakref.WeakKeyDictionary()
_POOLS: dict[int, ThreadPoolExecutor] = {}


def replicas(net: nn.Module, k: int) -> list[nn.Module]:
    """``net`` and ``k - 1`` copies of it, kept for the next round's game."""
    copies = _REPLICAS.setdefault(net, [])
    while len(copies) < k - 1:
        copies.append(copy.deepcopy(net))
    return [net, *copies[: k - 1]]


def thread_pool(k: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``k`` threads (created once per size)."""
    if k not in _POOLS:
        _POOLS[k] = ThreadPoolExecutor(max_workers=k, thread_name_prefix="coalitions")
    return _POOLS[k]
