"""``owen-paper``: Algorithm 1 of the FedOwen paper, literally, with its walks run in lockstep.

Algorithm 1: levels ``q = i/Q``, walks over the Bernoulli(q)-selected players in random order
crediting ``nu(C) - v_prev``, utilities normalised to ``nu(empty) = 0, nu(N) = 1``, a walk
stopped once ``1 - v_prev < eta``, and fresh walks (cycling through the levels) until the budget
is spent; the walk cut by the budget keeps its credits, as the algorithm's counter would. Its
fixed grid makes it biased: each walk's credits sum to nu(C), and the q = i/Q levels are not a
quadrature of the Shapley integral (docs/valuation.md). When ``|nu(N) - nu(empty)|`` is below
``FLAT`` the utility is only shifted (not divided) and truncation is off, so nothing blows up.

**Lockstep.** Read one walk at a time, Algorithm 1 asks for one coalition per utility call
(the next step depends on the last value). Its walks are independent, so here all admitted
walks advance one step per batched call and truncated walks drop out. The result equals the
one-walk-at-a-time order exactly (same seed, same values, same ``n_evals``;
``tests/test_owen_paper_lockstep.py`` checks it against the sequential code):

* walks are drawn from the generator in the sequential order (level ``k mod Q``);
* a walk is admitted only if its rows fit in the budget even if every walk before it runs to
  its end (the worst case), so the sequential run would certainly start and finish it too;
  budget saved by truncation admits further walks while the others are still running;
* a walk that cannot be admitted once all walks before it have finished runs alone, row by
  row, exactly as in the sequential algorithm (it may be cut by the budget, which ends the
  estimate);
* the guard against all-cached walks (stop after ``10 Q + 10`` walks in a row that charged
  nothing) is kept by capping each wave of admitted walks at the walks that guard still allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedowen_strategy.valuation._base import FLAT, BoolArray, CachedGame, FloatArray


@dataclass
class _Walk:
    """One walk of Algorithm 1: its level, player order, prefix masks and progress."""

    level: int
    order: np.ndarray
    masks: BoolArray
    credits: FloatArray
    t: int = 0  # rows evaluated so far
    v_prev: float = 0.0
    done: bool = False

    def rest(self) -> BoolArray:
        return self.masks[self.t :]


@dataclass(frozen=True)
class _Norm:
    v0: float
    scale: float
    eta: float | None  # None: no truncation


def _draw(rng: np.random.Generator, n: int, index: int, levels: int) -> _Walk:
    level = index % levels
    chosen = np.flatnonzero(rng.random(n) < (level + 1) / levels)
    order = rng.permutation(chosen)
    masks = np.zeros((len(order), n), dtype=bool)
    for t, j in enumerate(order):
        masks[t:, j] = True
    return _Walk(level, order, masks, np.zeros(n), done=len(order) == 0)


def _credit(walk: _Walk, values: FloatArray, norm: _Norm) -> None:
    """Credit the next ``len(values)`` rows of ``walk``; stop it on truncation or at its end."""
    if norm.eta is None:  # one batch per walk, as the sequential code
        nu = (values - norm.v0) / norm.scale
        walk.credits[walk.order[walk.t : walk.t + len(nu)]] = np.diff(np.concatenate([[0.0], nu]))
        walk.t += len(nu)
    else:
        for value in values:
            nu_c = (float(value) - norm.v0) / norm.scale
            walk.credits[walk.order[walk.t]] = nu_c - walk.v_prev
            walk.t += 1
            if 1.0 - nu_c < norm.eta:
                walk.done = True
                return
            walk.v_prev = nu_c
    walk.done = walk.done or walk.t == len(walk.order)


def _step(game: CachedGame, live: list[_Walk], norm: _Norm) -> None:
    """One batched call: the next row of every live walk (all rest rows without truncation)."""
    rows = [w.rest() if norm.eta is None else w.rest()[:1] for w in live]
    values = game(np.concatenate(rows))
    offset = 0
    for w, r in zip(live, rows, strict=True):
        _credit(w, values[offset : offset + len(r)], norm)
        offset += len(r)


def _fits(game: CachedGame, live: list[_Walk], walk: _Walk) -> bool:
    """Would ``walk`` surely start and finish after every live walk ran to its end?"""
    n = game.n_players
    rests = [w.rest() for w in live if not w.done]
    pending = np.concatenate([*rests, np.zeros((0, n), dtype=bool)])
    worst_live = game.cost(pending)
    worst = game.cost(np.concatenate([pending, walk.masks]))
    return worst <= game.remaining and worst_live < game.remaining


def _alone(game: CachedGame, walk: _Walk, norm: _Norm) -> bool:
    """Run ``walk`` by itself as the sequential algorithm does; False if the budget cut it."""
    if norm.eta is None:
        lo, hi = 0, len(walk.order)
        while lo < hi:  # longest prefix whose new rows fit
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if game.cost(walk.masks[:mid]) <= game.remaining else (lo, mid - 1)
        _credit(walk, game(walk.masks[:lo]), norm)
        return lo == len(walk.order)
    while not walk.done:
        if game.cost(walk.rest()[:1]) > game.remaining:
            return False
        _credit(walk, game(walk.rest()[:1]), norm)
    return True


def _charged(walk: _Walk, seen: set[bytes]) -> bool:
    """Did ``walk`` evaluate a row no earlier walk (in sequential order) had evaluated?"""
    keys = {row.tobytes() for row in np.packbits(walk.masks[: walk.t], axis=1)}
    new = bool(keys - seen)
    seen |= keys
    return new


def _run(game: CachedGame, rng: np.random.Generator, levels: int, norm: _Norm) -> list[_Walk]:
    """All walks of Algorithm 1 in sequential order, evaluated in lockstep waves."""
    n, limit = game.n_players, 10 * levels + 10
    ends = np.zeros((2, n), dtype=bool)
    ends[1] = True
    seen = {row.tobytes() for row in np.packbits(ends, axis=1)}
    walks: list[_Walk] = []
    pending: _Walk | None = None
    idle = 0
    while game.remaining > 0 and idle < limit:
        wave: list[_Walk] = []
        live: list[_Walk] = []
        while True:
            while len(wave) < limit - idle:
                pending = pending or _draw(rng, n, len(walks) + len(wave), levels)
                if not _fits(game, live, pending):
                    break
                wave.append(pending)
                live.append(pending)
                pending = None
            live = [w for w in live if not w.done]
            if not live:
                break
            _step(game, live, norm)
        if not wave:  # the next walk does not surely fit: run it alone, as Algorithm 1 does
            assert pending is not None
            wave, complete, pending = [pending], _alone(game, pending, norm), None
        else:
            complete = True
        for w in wave:
            idle = 0 if _charged(w, seen) else idle + 1
        walks += wave
        if not complete:
            break
    return walks


def owen_paper(
    game: CachedGame,
    rng: np.random.Generator,
    *,
    levels: int = 2,
    eta: float = 0.01,
) -> FloatArray:
    """Algorithm 1 of the FedOwen paper (Owen sampling with eta-truncation), walks in lockstep."""
    if not isinstance(levels, int) or levels < 1:
        raise ValueError(f"levels (Q) must be a positive int; got {levels!r}")
    if eta < 0:
        raise ValueError(f"eta must be >= 0 (normalised units); got {eta}")
    n = game.n_players
    v0, v1 = game.ends()
    normalise = abs(v1 - v0) >= FLAT
    scale = v1 - v0 if normalise else 1.0  # guard: only shift when the gain is ~0
    norm = _Norm(v0, scale, eta if normalise and eta > 0 else None)
    sums = np.zeros((levels, n))
    counts = np.zeros(levels, dtype=np.int64)
    walks = _run(game, rng, levels, norm)
    for w in walks:  # accumulate in the sequential order: bit-identical sums
        sums[w.level] += w.credits
        counts[w.level] += 1
    per_level = sums / np.maximum(counts, 1)[:, None]
    used = counts > 0
    return per_level[used].mean(axis=0) * scale if used.any() else np.zeros(n)
