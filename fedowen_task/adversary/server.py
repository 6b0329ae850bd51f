"""The server side of the attacks: omniscient attacks on the round's honest updates.

An attack with a ``server`` hook in the table (:mod:`fedowen_task.adversary.attacks`) needs
what a client cannot see: the other clients' updates, the standard omniscient threat model
of Byzantine-robustness benchmarks (Blades, ByzFL). Its clients train and reply as honest
ones; the ServerApp (``server_app.byzantine``) replaces their replies at the message
boundary with the rows the hook returns, so the attack acts the same under every strategy
and backend. Over the flat float64 updates ``d_i = trained_i - global`` (floating arrays):

- ``alie`` ("A little is enough", Baruch et al., NeurIPS 2019): every attacker sends
  ``mean - z * std`` (coordinate-wise, population std) of the honest updates, with
  ``adversary-alie-z`` or, when it is 0, the paper's ``z_max`` for the round's ``n`` replies
  and ``m`` attackers (:func:`baruch_z`);
- ``ipm`` (inner-product manipulation, Xie et al., UAI 2020): every attacker sends
  ``-epsilon * mean`` (``adversary-ipm-epsilon``), whose inner product with the honest mean
  is negative;
- ``adaptive``: each attacker keeps its own honest update (its direction scores like an
  honest one on the server's signal) and scales it to sit just under the tightest norm the
  defence lets through unchanged (the round's ``bound``, which the ServerApp reads from the
  defence's own function); where none is in force it scales by ``adversary-boost``;
- ``adaptive-backdoor``: its clients train on poisoned data (the ``backdoor``'s), and each
  shapes that backdoored update to pass the defaults: its direction put on the cone of
  directions whose cosine with the round's honest mean is at least the median honest
  client's (:func:`cone_projection`, only when it is below; the value game then reads it as
  aligned as a typical honest update), and its norm at ``0.99 x`` the bound in force, as
  ``adaptive`` (the norm cap clips nothing, so the average takes it whole). With
  ``adversary-knows = "defences"`` it also knows the run's defence list: where the list's
  screen steps, simulated on the round, would reject an attacker, every attacker's update is
  mixed with the honest update nearest it as little as lets as many of them through as can
  pass (:func:`evade`; the peers' filters, AlignIns, FLAME and MultiMetrics, are such steps).

Honest statistics come from the round's honest replies; with fewer than 2 of them the
attackers use their own honest updates instead (Baruch et al.'s non-omniscient variant).
ALIE and IPM attackers of one round send the same vector, as in the papers: exact copies.
``adversary-jitter`` > 0 adds to each attacker's vector Gaussian noise of that norm relative
to the vector's (:func:`jittered`), so they are no longer copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedowen_task.adversary.keys import AdversaryConfig

#: The adaptive attacker's margin under the bound (floating-point slack in the server's check).
MARGIN = 0.99
#: :func:`evade`'s bisection halvings (t to 1/256).
EVADE_STEPS = 8


@dataclass(frozen=True)
class RoundView:
    """What the omniscient attackers see of one round.

    ``honest`` and ``own`` are ``(h, d)`` and ``(m, d)``: the honest clients' updates and the
    attackers' own honest ones; ``replies`` the round's usable train replies (``n``);
    ``own_examples`` each attacker's ``num-examples``; ``bound(examples)`` the largest norm an
    attacker's update of that many examples may have and pass the defence unchanged, as the
    round's attackers face it (None: no bound in force); ``admits(sent)``, for the ``(m, d)``
    updates the attackers would send, whether the run's screen steps would keep each (None:
    not simulated).
    """

    honest: NDArray
    own: NDArray
    replies: int
    own_examples: Sequence[int]
    bound: Callable[[int], float | None]
    admits: Callable[[NDArray], Sequence[bool]] | None = None


#: The updates the ``m`` attackers send (``(m, d)``) and the attack's parameters (recorded).
ServerAttack = Callable[[RoundView, AdversaryConfig], tuple[NDArray, dict[str, Any]]]


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


def _statistics(view: RoundView) -> tuple[NDArray, dict[str, Any]]:
    """The honest updates, or the attackers' own with fewer than 2 of them; and which."""
    reference = view.honest if view.honest.shape[0] >= 2 else view.own
    return reference, {"statistics_from": "honest" if reference is view.honest
                       else "attackers"}


def alie(view: RoundView, cfg: AdversaryConfig) -> tuple[NDArray, dict[str, Any]]:
    """Every attacker sends :func:`alie_vector` at ``adversary-alie-z`` or :func:`baruch_z`."""
    reference, source = _statistics(view)
    z = cfg.alie_z or baruch_z(view.replies, view.own.shape[0])
    return np.tile(alie_vector(reference, z), (view.own.shape[0], 1)), {"z": z, **source}


def ipm(view: RoundView, cfg: AdversaryConfig) -> tuple[NDArray, dict[str, Any]]:
    """Every attacker sends :func:`ipm_vector` at ``adversary-ipm-epsilon``."""
    reference, source = _statistics(view)
    eps = cfg.ipm_epsilon
    return np.tile(ipm_vector(reference, eps), (view.own.shape[0], 1)), {"epsilon": eps,
                                                                         **source}


def adaptive(view: RoundView, cfg: AdversaryConfig) -> tuple[NDArray, dict[str, Any]]:
    """Each attacker's own update scaled to ``0.99 x`` its bound (:func:`adaptive_scale`)."""
    bounds = [view.bound(ex) for ex in view.own_examples]
    factors = [adaptive_scale(float(np.linalg.norm(row)), b, cfg.boost)
               for row, b in zip(view.own, bounds, strict=True)]
    return view.own * np.asarray(factors)[:, None], {"bounds": bounds, "factors": factors}


def cosine(a: NDArray, b: NDArray) -> float:
    """``a . b / (|a| |b|)``; 0 when either is zero."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 0.0 if na == 0.0 or nb == 0.0 else float(np.dot(a, b) / (na * nb))


def honest_alignment(honest: NDArray) -> float:
    """The median cosine of the honest updates with their mean (how aligned a typical honest
    update is with the round's direction)."""
    rows = _rows(honest)
    mean = rows.mean(axis=0)
    return float(np.median([cosine(row, mean) for row in rows]))


def cone_projection(update: NDArray, reference: NDArray, least: float) -> NDArray:
    """The vector of ``update``'s norm nearest ``update`` among those whose cosine with
    ``reference`` is at least ``least``: ``update`` itself when it is already there, else
    ``|update| (least r + sqrt(1 - least^2) p)``, ``r`` the reference's unit vector and ``p``
    the unit vector of ``update``'s part orthogonal to it (for an update exactly against the
    reference, whose nearest such vectors are all at one distance: the one turned towards the
    axis on which ``r`` is smallest). A zero ``update`` or ``reference`` is returned as it
    is."""
    if not -1.0 <= least <= 1.0:
        raise ValueError(f"a cosine must lie in [-1, 1], got {least!r}")
    u, ref = np.asarray(update, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    norm, ref_norm = float(np.linalg.norm(u)), float(np.linalg.norm(ref))
    if norm == 0.0 or ref_norm == 0.0 or cosine(u, ref) >= least:
        return u.copy()
    r = ref / ref_norm
    ortho = u - np.dot(u, r) * r
    ortho_norm = float(np.linalg.norm(ortho))
    if ortho_norm == 0.0:  # exactly against the reference: every orthogonal turn is as near
        axis = np.zeros_like(r)
        axis[int(np.argmin(np.abs(r)))] = 1.0
        ortho = axis - np.dot(axis, r) * r
        ortho_norm = float(np.linalg.norm(ortho))
        if ortho_norm == 0.0:  # one dimension: the reference's direction is all there is
            return norm * r
    return norm * (least * r + math.sqrt(max(0.0, 1.0 - least * least)) * ortho / ortho_norm)


def adaptive_backdoor(view: RoundView, cfg: AdversaryConfig) -> tuple[NDArray, dict[str, Any]]:
    """Each attacker's backdoored update put on the honest cone (:func:`cone_projection` onto
    the honest mean at :func:`honest_alignment`), then scaled to ``0.99 x`` its bound
    (:func:`adaptive_scale`). With fewer than 2 honest updates there is no honest direction
    to read: the direction is left as trained."""
    shaped, params = _on_honest_cone(view)
    bounds = [view.bound(ex) for ex in view.own_examples]
    factors = [adaptive_scale(float(np.linalg.norm(row)), b, cfg.boost)
               for row, b in zip(shaped, bounds, strict=True)]
    sent = shaped * np.asarray(factors)[:, None]
    params.update(bounds=bounds, factors=factors)
    if cfg.knows == "defences" and view.admits is not None and view.honest.shape[0] >= 1:
        sent, evaded = evade(sent, view.honest, view.admits)
        params.update(evaded)
    if len(sent) >= 2:  # how close the attackers came to each other (link-cosine links them)
        params["attackers_max_cosine"] = max(cosine(sent[i], sent[j]) for i in range(len(sent))
                                             for j in range(i + 1, len(sent)))
    return sent, params


def evade(sent: NDArray, honest: NDArray, admits: Callable[[NDArray], Sequence[bool]],
          steps: int = EVADE_STEPS) -> tuple[NDArray, dict[str, Any]]:
    """``sent`` mixed with honest updates as little as lets ``admits`` keep as many rows as it
    can: row ``i`` becomes ``(1 - t) h_i + t sent_i``, ``h_i`` the honest update nearest it in
    direction (largest cosine); ``t = 1`` (``sent`` as it is) when every row is admitted, else
    the largest ``t`` in [2^-steps, 1] that a bisection of ``steps`` halvings finds with as
    many rows admitted as at ``2^-steps``, the most honest-looking it can be without copying an
    honest client, which the links would catch (none admitted even there: sent there).
    Recorded: ``evade_t``, ``admitted`` (per row, at that ``t``) and ``evade_checks``."""
    rows = _rows(honest)
    unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-300)
    nearest = rows[np.argmax(sent @ unit.T, axis=1)]

    def at(t: float) -> NDArray:
        return (1.0 - t) * nearest + t * sent

    checks, low, high = 1, 2.0 ** -steps, 1.0
    kept = list(admits(sent))
    if all(kept):
        return sent, {"evade_t": 1.0, "admitted": kept, "evade_checks": checks}
    kept = list(admits(at(low)))
    checks += 1
    need = sum(kept)  # as many as get through when mixed the most (a filter that always
    if need:          # rejects a share, as MultiMetrics', may not let all of them through)
        for _ in range(steps):
            mid = (low + high) / 2
            found = list(admits(at(mid)))
            checks += 1
            if sum(found) >= need:
                low, kept = mid, found
            else:
                high = mid
    return at(low), {"evade_t": low, "admitted": kept, "evade_checks": checks}


def _on_honest_cone(view: RoundView) -> tuple[NDArray, dict[str, Any]]:
    """The attackers' updates on the honest cone, and what it took (recorded)."""
    own = np.array(view.own, dtype=np.float64, copy=True)
    if view.honest.shape[0] < 2:
        return own, {"least_cosine": None}
    mean = _rows(view.honest).mean(axis=0)
    least = honest_alignment(view.honest)
    shaped = np.stack([cone_projection(row, mean, least) for row in own]) if len(own) else own
    return shaped, {"least_cosine": least,
                    "cosines_before": [cosine(row, mean) for row in own],
                    "cosines_after": [cosine(row, mean) for row in shaped]}


def _rows(matrix: NDArray) -> NDArray:
    rows = np.asarray(matrix, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] < 1:
        raise ValueError(f"expected an (h, d) array of h >= 1 updates, got shape {rows.shape}")
    return rows
