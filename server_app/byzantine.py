"""Omniscient Byzantine attacks, applied at the ServerApp's message boundary (simulation only).

``adversary-kind = "alie" | "ipm" | "adaptive"`` need the honest clients' updates of the round:
the standard omniscient threat model of Byzantine-robustness benchmarks (Blades, ByzFL), in
which an attack is a function of the honest vectors. A client cannot see them, so the clients
of these kinds train and reply as honest ones (:data:`fedowen_task.config.SERVER_SIDE_KINDS`)
and :class:`ByzantineGrid`, wrapped around the ServerApp's grid, replaces their replies before
any strategy sees them: the attacks act the same under every strategy (FedOwen's and
Flower's) and both backends (``flwr run``'s Ray simulation, the inline grid).

Over the flat float64 updates ``d_i = trained_i - global`` (floating arrays only):

- ``alie`` ("A little is enough", Baruch et al., NeurIPS 2019): every attacker sends
  ``mean - z * std`` (coordinate-wise, population std) of the honest updates, with
  ``adversary-alie-z`` or, when it is 0, the paper's ``z_max`` for the round's ``n`` replies
  and ``m`` attackers (:func:`baruch_z`);
- ``ipm`` (inner-product manipulation, Xie et al., UAI 2020): every attacker sends
  ``-epsilon * mean`` (``adversary-ipm-epsilon``), whose inner product with the honest mean
  is negative;
- ``adaptive``: each attacker keeps its own honest update (its direction scores like an
  honest one on the server's signal) and scales it to sit just under the tightest norm the
  run's defences let through unchanged (:func:`attacker_bound`: FedOwen's own
  :func:`fedowen_strategy.guards.bound_in_force`, so ``max-norm-ratio``, ``update-bound`` and
  ``norm-cap`` as the guards apply them); where none is in force it scales by
  ``adversary-boost``.

Honest statistics come from the round's replies of non-adversarial clients that carry no
error; with fewer than 2 of them the attackers use their own honest updates instead
(Baruch et al.'s non-omniscient variant). ALIE and IPM attackers of one round send the same
vector, as in the papers: exact copies, which FedOwen's copy check links and bans after their
first round together. ``adversary-jitter`` > 0 adds to each attacker's vector Gaussian noise
of that norm relative to the vector's, seeded by (seed, round, client id), so they are no
longer copies (an attacker who knows the check); without it the attacks are deterministic
given the replies.
Integer arrays (counters) come from the attacker's own reply. Only ``train`` messages are
touched; queries and evaluations pass through, as do bare ``push_messages`` /
``pull_messages`` (every strategy's ``start`` uses ``send_and_receive``). Each attacked round
is logged (one INFO line), kept in :attr:`ByzantineGrid.log` and handed to ``on_round``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid
from numpy.typing import NDArray

from fedowen_strategy.bounds import lower_median
from fedowen_strategy.guards import Median, bound_in_force
from fedowen_strategy.replies import client_id_of, record_to_state, state_to_record
from fedowen_strategy.updates import State, apply_delta, flat_delta, flatten, float_keys
from fedowen_task.config import SERVER_SIDE_KINDS
from fedowen_task.partition import adversary_ids
from server_app.config import RunConfig

log = logging.getLogger(__name__)
#: The adaptive attacker's margin under the bound (floating-point slack in the server's check).
MARGIN = 0.99
AttackHook = Callable[[int, dict[str, Any]], None]


def alie_vector(honest: NDArray, z: float) -> NDArray:
    """``mean - z * std`` of the rows of ``honest`` (coordinate-wise, population std)."""
    rows = _rows(honest)
    return rows.mean(axis=0) - z * rows.std(axis=0)


def ipm_vector(honest: NDArray, epsilon: float) -> NDArray:
    """``-epsilon * mean`` of the rows of ``honest``."""
    return -epsilon * _rows(honest).mean(axis=0)


def jittered(deltas: NDArray, relative: float, seed: int, server_round: int,
             clients: Sequence[str]) -> NDArray:
    """Each row plus Gaussian noise of norm ``relative`` x the row's, from a generator seeded
    by (seed, round, client id): the same attack, no longer an exact copy of the others'."""
    out = np.array(deltas, dtype=np.float64, copy=True)
    for i, client in enumerate(clients):
        key = [seed, server_round, *(ord(ch) for ch in client)]
        noise = np.random.default_rng(np.random.SeedSequence(key)).normal(size=out.shape[1])
        scale = np.linalg.norm(noise)
        if scale > 0:
            out[i] += relative * np.linalg.norm(out[i]) * noise / scale
    return out


def baruch_z(n: int, m: int) -> float:
    """Baruch et al.'s ``z_max``: ``s = floor(n/2 + 1) - m`` honest supporters needed,
    ``z = Phi^{-1}((n - s) / n)``. ``s`` is kept in ``[1, n - 1]`` (attackers at least half of
    the round would need none; a probability of 0 or 1 has no quantile); 0 for ``n < 2``."""
    if n < 1 or not 0 <= m <= n:
        raise ValueError(f"baruch_z needs n >= 1 replies and 0 <= m <= n attackers, got "
                         f"n={n}, m={m}")
    if n < 2:
        return 0.0
    s = min(max(math.floor(n / 2 + 1) - m, 1), n - 1)
    return NormalDist().inv_cdf((n - s) / n)


def adaptive_scale(own_norm: float, bound: float | None, boost: float) -> float:
    """The factor that puts an update of norm ``own_norm`` at ``0.99 x bound``; ``boost``
    when no bound is in force; 1 for a zero update (nothing to scale)."""
    if bound is None:
        return boost
    if own_norm <= 0.0:
        return 1.0
    return MARGIN * bound / own_norm


def median_faced(others: Sequence[float], attackers: int, factor: float) -> float | None:
    """The round's lower-median norm (positive norms) that the server computes when the
    ``attackers`` each send ``factor`` x it beside the honest ``others``: the attack moves the
    median it is measured against, so an omniscient attacker solves for it. None when the
    attackers' own updates would set it (they are at least the median's rank)."""
    pos = sorted(v for v in others if v > 0.0)
    rank = (len(pos) + attackers - 1) // 2  # the lower median's index among all replies
    if factor >= 1.0:  # the attackers sit at or above it: an honest norm of rank `rank`
        return pos[rank] if rank < len(pos) else None
    # just under it: all `attackers` rank below, so it is the honest norm `attackers` lower
    return pos[rank - attackers] if attackers <= rank < len(pos) + attackers else None


def attacker_bound(cfg: RunConfig, norms: Sequence[float], examples: Sequence[int],
                   own_examples: int, global_norm: float, server_norm: float | None = None,
                   others: Sequence[float] | None = None, attackers: int = 0) -> float | None:
    """The largest norm an update of ``own_examples`` examples may have and pass the run's
    defences unchanged, as an omniscient attacker knows them: FedOwen's own
    :func:`fedowen_strategy.guards.bound_in_force` under the run config's guards, read from
    the round's honest update ``norms`` and ``examples`` (the attackers' honest ones
    included), the global model's norm and, for ``norm-cap = "server"``, ``server_norm``, the
    norm of the round's server step (without it, the median is the attacker's estimate).
    Given the honest ``others`` and the number of ``attackers`` sending at the bound, the
    median the cap reads is the one their own updates leave (:func:`median_faced`), not the
    median of every honest update, which a multiple above 1 puts below what the server will
    let through. None under any other strategy than FedOwen: its guards are not in force
    (FLTrust rescales every update to the server's norm whatever was sent).
    """
    if cfg.strategy != "fedowen":
        return None
    guards = cfg.guards()
    median: Median = lower_median
    if others is not None and attackers > 0:
        def median(_: Sequence[float]) -> float | None:
            return median_faced(others, attackers, MARGIN * guards.norm_cap_multiple)
    return bound_in_force(guards, cfg.norm_cap_mode(), norms=norms, examples=examples,
                          own_examples=own_examples, global_norm=global_norm,
                          server_norm=server_norm, median=median)


def attack_deltas(cfg: RunConfig, honest: NDArray, own: NDArray, *, n: int,
                  norms: Sequence[float], examples: Sequence[int],
                  own_examples: Sequence[int], global_norm: float,
                  server_norm: float | None = None) -> tuple[NDArray, dict[str, Any]]:
    """The ``(m, d)`` updates the ``m`` attackers send (rows of ``own``: their honest updates)
    and the attack's parameters, for ``cfg.adversary_kind``; ``honest`` is ``(h, d)``."""
    kind, m = cfg.adversary_kind, own.shape[0]
    reference = honest if honest.shape[0] >= 2 else own
    source = {"statistics_from": "honest" if reference is honest else "attackers"}
    if kind == "alie":
        z = cfg.adversary_alie_z or baruch_z(n, m)
        return np.tile(alie_vector(reference, z), (m, 1)), {"z": z, **source}
    if kind == "ipm":
        eps = cfg.adversary_ipm_epsilon
        return np.tile(ipm_vector(reference, eps), (m, 1)), {"epsilon": eps, **source}
    if kind == "adaptive":
        others = [float(np.linalg.norm(row)) for row in honest]
        bounds = [attacker_bound(cfg, norms, examples, ex, global_norm, server_norm,
                                 others=others, attackers=m)
                  for ex in own_examples]
        factors = [adaptive_scale(float(np.linalg.norm(row)), b, cfg.adversary_boost)
                   for row, b in zip(own, bounds, strict=True)]
        return own * np.asarray(factors)[:, None], {"bounds": bounds, "factors": factors}
    raise ValueError(f"adversary-kind={kind!r} is not a server-side kind "
                     f"({', '.join(SERVER_SIDE_KINDS)})")


@dataclass(frozen=True)
class _Reply:
    """One usable train reply: its message, sender, round and update."""

    message: Message
    client_id: str
    server_round: int
    global_state: dict[str, NDArray]
    state: dict[str, NDArray]
    delta: NDArray
    examples: int


class ByzantineGrid(Grid):
    """A grid that forwards everything to ``inner`` and, in :meth:`send_and_receive`, replaces
    the train replies of the run's adversaries with the ``cfg.adversary_kind`` attack.

    Parameters
    ----------
    inner : Grid
        The grid the ServerApp was given.
    cfg : RunConfig
        The run config (attack kind and parameters, the defences an adaptive attacker reads).
    num_partitions : int
        Partitions of the simulation; adversaries are
        ``adversary_ids(num_partitions, adversary-fraction, seed)``, named by client id.
    on_round : callable, optional
        Called with ``(server_round, entry)`` for every attacked round (the run's records).
    server_step : callable, optional
        ``(global_state, round) -> state``: the server step that ``norm-cap = "server"``
        takes its reference norm from (the ServerApp passes the strategy's own, cached per
        round), so the adaptive attacker knows that bound as it knows the honest updates.
    """

    def __init__(self, inner: Grid, cfg: RunConfig, num_partitions: int,
                 on_round: AttackHook | None = None,
                 server_step: Callable[[State, int], State] | None = None) -> None:
        if cfg.adversary_kind not in SERVER_SIDE_KINDS:
            raise ValueError(f"adversary-kind={cfg.adversary_kind!r} is not one of "
                             f"{', '.join(SERVER_SIDE_KINDS)}")
        self.inner, self.cfg, self.on_round = inner, cfg, on_round
        self.server_step = server_step
        self.adversaries = frozenset(str(i) for i in adversary_ids(
            num_partitions, cfg.adversary_fraction, cfg.seed))
        self.log: list[dict[str, Any]] = []
        self._train_calls = 0

    # Everything but send_and_receive is the inner grid's.
    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.inner.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.inner.pull_messages(message_ids)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """The inner grid's replies, those of adversaries to train messages attacked."""
        messages = list(messages)
        sent = _train_globals(messages)  # read before sending: a transport may consume them
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        if sent:
            self._train_calls += 1
            self._attack(replies, sent)
        return replies

    def _attack(self, replies: list[Message], sent: dict[int, tuple[int, State]]) -> None:
        rows = [r for r in (_usable(reply, sent) for reply in replies) if r is not None]
        bad = [r for r in rows if r.client_id in self.adversaries]
        if not bad:
            return
        honest = [r for r in rows if r.client_id not in self.adversaries]
        width = bad[0].delta.size
        honest_deltas = _stack([r.delta for r in honest], width)
        own_deltas = _stack([r.delta for r in bad], width)
        global_state = bad[0].global_state
        global_norm = float(np.linalg.norm(flatten(global_state, float_keys(global_state))))
        server_round = bad[0].server_round or self._train_calls
        server_norm = None
        if (self.cfg.adversary_kind == "adaptive" and self.server_step is not None
                and self.cfg.norm_cap_mode() == "server"):
            step = self.server_step(global_state, server_round)
            server_norm = float(np.linalg.norm(flat_delta(step, global_state)))
        deltas, params = attack_deltas(
            self.cfg, honest_deltas, own_deltas, n=len(rows),
            norms=[float(np.linalg.norm(r.delta)) for r in rows],
            examples=[r.examples for r in rows], own_examples=[r.examples for r in bad],
            global_norm=global_norm, server_norm=server_norm)
        if self.cfg.adversary_jitter > 0:
            deltas = jittered(deltas, self.cfg.adversary_jitter, self.cfg.seed, server_round,
                              [r.client_id for r in bad])
            params["jitter"] = self.cfg.adversary_jitter
        for row, delta in zip(bad, deltas, strict=True):
            row.message.content["arrays"] = state_to_record(apply_delta(
                row.global_state, delta, float_keys(row.global_state), others=row.state))
        entry = {"round": server_round, "kind": self.cfg.adversary_kind,
                 "clients": [r.client_id for r in bad], "replies": len(rows),
                 "honest": len(honest), **params,
                 "norms": [float(np.linalg.norm(d)) for d in deltas]}
        self.log.append(entry)
        log.info("round %d: %s attack by clients %s (%d of %d replies; %s): sent update "
                 "norm(s) %s", server_round, entry["kind"], ", ".join(entry["clients"]),
                 len(bad), len(rows), _describe(params),
                 ", ".join(f"{v:.4g}" for v in entry["norms"]))
        if self.on_round is not None:
            self.on_round(server_round, entry)


def _describe(params: Mapping[str, Any]) -> str:
    parts = []
    for key, value in params.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        elif isinstance(value, list):
            parts.append(f"{key}=[{', '.join('-' if v is None else f'{v:.4g}' for v in value)}]")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def _rows(matrix: NDArray) -> NDArray:
    rows = np.asarray(matrix, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] < 1:
        raise ValueError(f"expected an (h, d) array of h >= 1 updates, got shape {rows.shape}")
    return rows


def _stack(vectors: list[NDArray], width: int) -> NDArray:
    return np.stack(vectors) if vectors else np.empty((0, width))


def _train_globals(messages: list[Message]) -> dict[int, tuple[int, State]]:
    """Destination node -> (server round, global model) of every train message."""
    out: dict[int, tuple[int, State]] = {}
    decoded: dict[int, State] = {}  # one decoding per ArrayRecord (shared by a round's messages)
    for msg in messages:
        if (msg.metadata.message_type.split(".")[0] != MessageType.TRAIN
                or not msg.has_content() or "arrays" not in msg.content.array_records):
            continue
        record = msg.content.array_records["arrays"]
        if id(record) not in decoded:
            decoded[id(record)] = record_to_state(record)
        config = msg.content.config_records.get("config")
        server_round = config.get("server-round", 0) if config is not None else 0
        out[msg.metadata.dst_node_id] = (server_round if isinstance(server_round, int) else 0,
                                         decoded[id(record)])
    return out


def _usable(reply: Message, sent: Mapping[int, tuple[int, State]]) -> _Reply | None:
    """The reply's update, or None when it is an error, answers no train message or does not
    match its global model (the strategy then judges it as it is)."""
    node = reply.metadata.src_node_id
    if reply.has_error() or not reply.has_content() or node not in sent:
        return None
    if "arrays" not in reply.content.array_records:
        return None
    server_round, global_state = sent[node]
    state = record_to_state(reply.content.array_records["arrays"])
    if list(state) != list(global_state) or any(
            state[k].shape != v.shape or state[k].dtype != v.dtype
            for k, v in global_state.items()):
        return None
    metrics = next(iter(reply.content.metric_records.values()), None)
    count = metrics.get("num-examples", 0) if metrics is not None else 0
    examples = (int(count) if isinstance(count, int | float) and math.isfinite(count)
                and count > 0 else 0)
    return _Reply(reply, client_id_of(reply), server_round, dict(global_state), state,
                  flat_delta(state, global_state), examples)
