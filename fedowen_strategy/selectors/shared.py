"""What every selector shares: the identity cap, the link groups, and a run's selection.

:class:`Selection` is the strategy's one handle on selection. It holds one
:class:`~fedowen_strategy.selectors.base.Selector` and, for every selector alike,

- the **identity cap** (``selection-cap``): a client, or a lasting link group (one identity),
  selected in more than ``cap`` times its uniform share of the rounds so far is not eligible
  (:func:`cap_eligible`); the selector chooses among the eligible;
- the **link groups** (``link-memory``): clients whose updates were linked (near-parallel,
  :mod:`fedowen_strategy.defences.links`) in at least ``link-memory`` rounds are one identity
  for the cap and one arm in :attr:`~fedowen_strategy.selectors.base.Pool.arms`;
- the run's **selection stream** (a ``numpy.random.Generator``), the selection counts and the
  links, checkpointed beside the selector's own memory (:meth:`Selection.state`);
- the **selector's cost a round**, alike for every selector (:meth:`Selection.costs`): the
  ``query`` messages it sent (``extra_messages``) and the server seconds it took to choose,
  weigh and observe (``selector_seconds``; waiting on the clients it asked is not its compute).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.links import Pair, count_links, lasting_groups
from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    ConfigValue,
    Pool,
    Seen,
    Selector,
    SelectorSettings,
)
from fedowen_strategy.settings import NO_KEYS, Keys, Settings, key
from fedowen_task import declare

if TYPE_CHECKING:
    from flwr.app import RecordDict

#: ``selection-cap``'s default: each selector's own identity cap
#: (:func:`fedowen_strategy.selectors.registry.resolve_cap`).
AUTO_CAP = -1.0


@dataclass(frozen=True)
class SelectionParams(Settings):
    """What every selector shares (defaults: the app's); each selector's own keys are on its
    settings (:data:`fedowen_strategy.selectors.SELECTORS`).

    Parameters
    ----------
    link_memory : int
        Clients whose updates were linked (near-parallel, ``link-cosine``) in at least this
        many rounds are one identity from then on: one arm (the adaptive selector selects at
        most one of them in a round, with one client's chance between them) and one share of
        the identity cap (0, the default: off). Against colluding Sybils, whose k identities
        are otherwise selected about k times as often as one.
    cap : float
        Identity cap: a client (or a lasting link group) selected ``cap`` times its uniform
        share so far sits a round out (0: off; else >= 1). The default, :data:`AUTO_CAP`, is
        the selector's own.
    exclusion_level, exclusion_min_rounds : float, int
        Exclusion after a resolved negative contribution, around any selector
        (:mod:`fedowen_strategy.selectors.exclusion`): a client whose mean phi is resolved
        below 0 at this one-sided level over a run, after at least ``exclusion_min_rounds``
        valued rounds (>= 2), is not drawn again and weighs 0 (0, the default: off).
    """

    link_memory: int = declare.key(
        0, "rounds linked before clients are one arm (0: off)", name="link-memory")
    cap: float = declare.key(
        AUTO_CAP, "selections beyond cap x a uniform share sit out (0: off; -1: the selector's "
        "own)", name="selection-cap")
    exclusion_level: float = declare.key(
        0.0, "exclude a client once its mean phi is below 0 at this one-sided level over the "
        "run (0: off)", name="exclusion-level")
    exclusion_min_rounds: int = declare.key(
        2, "valued rounds a client needs before exclusion-level tests it (>= 2)",
        name="exclusion-min-rounds")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings (:class:`~fedowen_strategy.settings.
        Settings`)."""
        k = partial(key, keys)
        checks = [
            (self.link_memory >= 0,
             f"{k('link_memory')}={self.link_memory!r} must be >= 0 (rounds; 0 = off)"),
            (self.cap in (0.0, AUTO_CAP) or 1.0 <= self.cap < math.inf,
             f"{k('cap')}={self.cap!r} must be 0 (off), {AUTO_CAP:g} (the selector's own) or "
             "a finite number >= 1"),
            (0.0 <= self.exclusion_level < 1.0,
             f"{k('exclusion_level')}={self.exclusion_level!r} must lie in [0, 1) (0 = off; "
             "e.g. 0.05)"),
            (self.exclusion_min_rounds >= 2,
             f"{k('exclusion_min_rounds')}={self.exclusion_min_rounds!r} must be >= 2 (the "
             "test needs two valued rounds)"),
        ]
        return [message for ok, message in checks if not ok]


def round_size(num_clients: int, clients_per_round: int | None, fraction_train: float,
               min_train: int) -> int:
    """k for a round with ``num_clients`` selectable clients: ``clients_per_round``, else
    Flower FedAvg's rule ``max(int(n * fraction_train), min_train)``; never more than n."""
    if clients_per_round is not None:
        return min(clients_per_round, num_clients)
    return min(max(int(num_clients * fraction_train), min_train), num_clients)


def select_uniform(n: int, k: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """``k`` of ``n`` uniformly without replacement, sorted (FedAvg's selection)."""
    if not 1 <= k <= n:
        raise ValueError(f"cannot select k={k} clients out of {n}; need 1 <= k <= {n}")
    return np.sort(rng.choice(n, size=k, replace=False))


def cap_eligible(picks: NDArray[np.int64], group_of: NDArray[np.int64], t: int, k: int,
                 cap: float) -> NDArray[np.bool_]:
    """Which clients may be selected in round ``t``: an identity (a group of clients sharing
    ``group_of``, one client by default) whose selections so far reach ``cap`` times one
    client's uniform share, ``cap (t - 1) k / n`` (at least 1), is not. ``cap`` 0: all."""
    picks = np.asarray(picks)
    if cap <= 0.0:
        return np.ones(picks.size, dtype=bool)
    limit = max(1.0, cap * (t - 1) * k / picks.size)
    _, group = np.unique(group_of, return_inverse=True)
    per_group = np.bincount(group, weights=picks)
    return np.asarray(per_group[group] < limit)


def link_arms(pair_links: Mapping[Pair, int], link_memory: int, keys: Sequence[str]
              ) -> NDArray[np.int64] | None:
    """Each key's arm (the lasting link groups of ``link_memory`` rounds share one); None
    when no two keys share one."""
    groups = lasting_groups(pair_links, link_memory)
    if not groups:
        return None
    arm = {c: g[0] for g in groups for c in g}
    labels = [arm.get(c, c) for c in keys]
    if len(set(labels)) == len(labels):
        return None
    _, arm_of = np.unique(labels, return_inverse=True)
    return np.asarray(arm_of, dtype=np.int64)


class Selection:
    """A run's selection: ``selector`` behind the identity cap and the link groups (module
    docstring). ``name`` is the selector's name (checked when a checkpoint loads),
    ``settings`` its settings (logged), ``cap`` the resolved identity cap, ``rng`` the
    selection stream; ``make(settings)`` builds the selector again (:meth:`for_run`; default:
    its class)."""

    def __init__(self, name: str, selector: Selector, settings: Settings,
                 params: SelectionParams, cap: float, rng: np.random.Generator,
                 make: Callable[[Any], Selector] | None = None) -> None:
        self.name, self.selector, self.settings = name, selector, settings
        # a selector's class is built from its settings (the protocol declares no __init__)
        self.make = make or cast(Callable[[Any], Selector], type(selector))
        self.params, self.cap, self.rng = params, cap, rng
        self.picks: dict[str, int] = {}
        self.pair_links: dict[Pair, int] = {}
        self.seconds, self.sent = 0.0, 0  # this round's cost so far (costs())

    def choose(self, keys: Sequence[str], server_round: int, k: int,
               ask: AskClients | None = None) -> Choice:
        """``k`` of ``keys`` (ids, in id order) by the selector, within the identity cap;
        ``indices`` into ``keys``. ``ask(indices into keys, config, with_model)`` sends
        ``query`` messages (needed by a selector that asks clients before it chooses)."""
        if not 1 <= k <= len(keys):
            raise ValueError(f"cannot select k={k} clients out of {len(keys)}; "
                             f"need 1 <= k <= {len(keys)}")
        eligible = cap_eligible(np.array([self.picks.get(c, 0) for c in keys]),
                                self.groups(keys), server_round, k, self.cap)
        pool = np.flatnonzero(eligible) if eligible.sum() >= k else np.arange(len(keys))
        pool_keys = tuple(keys[i] for i in pool.tolist())
        self.seconds, self.sent = 0.0, 0
        waited = 0.0

        def ask_pool(indices: Sequence[int], config: Mapping[str, ConfigValue],
                     with_model: bool = True) -> list[RecordDict | None]:
            nonlocal waited
            if ask is None:
                raise ValueError(f"selection={self.name!r} asks clients before it chooses: "
                                 "pass ask (the strategy's query to clients)")
            self.sent += len(indices)
            start = time.perf_counter()
            try:
                return ask([int(pool[i]) for i in indices], config, with_model)
            finally:
                waited += time.perf_counter() - start

        start = time.perf_counter()
        choice = self.selector.choose(Pool(pool_keys, k, server_round,
                                           self.arms(pool_keys)), self.rng, ask_pool)
        self.seconds += time.perf_counter() - start - waited
        chosen = np.sort(pool[np.asarray(choice.indices, dtype=np.int64)])
        for i in chosen.tolist():
            self.picks[keys[i]] = self.picks.get(keys[i], 0) + 1
        record = dict(choice.record or {})
        if self.cap:
            record["capped"] = len(keys) - int(eligible.sum())
        return Choice(chosen, choice.how, {**record, "how": choice.how})

    def for_run(self, num_rounds: int) -> None:
        """Resolve the settings' keys whose default is the run's length for a run of
        ``num_rounds`` rounds in all (:meth:`~fedowen_strategy.selectors.base.SelectorSettings.
        for_run`, e.g. ``hics-rounds = 0``); the selector is built again from them, its memory
        kept. Unchanged settings (the app resolves them first) leave it as it is."""
        if not isinstance(self.settings, SelectorSettings):
            return
        settings = self.settings.for_run(num_rounds)
        if settings == self.settings:
            return
        memory = self.selector.state()
        self.selector, self.settings = self.make(settings), settings
        self.selector.load(memory)

    def costs(self) -> dict[str, float | int]:
        """The round's selector cost, for its record once the round is observed:
        ``extra_messages`` (the ``query`` messages the selector sent before it chose) and
        ``selector_seconds`` (server seconds in its choose, weigh and observe, less the time
        spent waiting on the clients it asked)."""
        return {"extra_messages": self.sent, "selector_seconds": round(self.seconds, 6)}

    def groups(self, keys: Sequence[str]) -> NDArray[np.int64]:
        """Each key's identity for the cap: its lasting link group's, else its own."""
        arm_of = self.arms(keys)
        return np.arange(len(keys)) if arm_of is None else arm_of

    def arms(self, keys: Sequence[str]) -> NDArray[np.int64] | None:
        """Each key's arm (:func:`link_arms`); None when no two keys share one."""
        return link_arms(self.pair_links, self.params.link_memory, keys)

    def train_config(self) -> dict[str, ConfigValue]:
        """What the selector asks of the trained clients."""
        return self.selector.train_config()

    def observe(self, seen: Seen, links: Sequence[Sequence[str]] = ()) -> None:
        """Count the round's linked groups (with ``link_memory``) and show the selector the
        round."""
        if self.params.link_memory and links:
            self.pair_links = count_links(self.pair_links, links)
        start = time.perf_counter()
        self.selector.observe(seen)
        self.seconds += time.perf_counter() - start

    def weigh(self, clients: Sequence[str], weights: NDArray[np.float64]
              ) -> NDArray[np.float64]:
        """The selector's aggregation weights (:meth:`Selector.weigh`)."""
        start = time.perf_counter()
        try:
            return self.selector.weigh(clients, weights)
        finally:
            self.seconds += time.perf_counter() - start

    def step_weights(self) -> bool:
        """Whether the selector's weights are a step (:meth:`Selector.step_weights`)."""
        return self.selector.step_weights()

    def state(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint: the selector's memory and the shared parts."""
        return {"selector": self.name, "state": self.selector.state(),
                "picks": dict(self.picks),
                "pair_links": [[a, b, n] for (a, b), n in sorted(self.pair_links.items())],
                "rng": self.rng.bit_generator.state}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`; also a checkpoint from before the selector protocol (one
        flat book for every selector, whose keys each selector reads as it wrote them)."""
        if "selector" not in state:
            if "select_rng" not in state:
                raise ValueError("the checkpoint holds no selection state (neither "
                                 "'selector' nor 'select_rng'); start the run afresh")
            state = {"selector": self.name, "state": state, "picks": state.get("picks", {}),
                     "pair_links": state.get("pair_links", []), "rng": state["select_rng"]}
        if state["selector"] != self.name:
            raise ValueError(f"the checkpoint's selection state is selection="
                             f"{state['selector']!r}'s, this run selects with {self.name!r}: "
                             f"resume with selection={state['selector']!r} (the settings it "
                             "was made with) or start afresh")
        self.selector.load(state["state"])
        self.picks = {str(c): int(n) for c, n in state.get("picks", {}).items()}
        self.pair_links = {(str(a), str(b)): int(n) for a, b, n in state.get("pair_links", [])}
        self.rng.bit_generator.state = state["rng"]
