"""Linking near-parallel updates into one player: replication robustness for the game.

Plain Shapley values are not replication-robust: an actor that sends k noisy copies of one
useful update under k identities is paid about k times what it would earn alone (the arena:
20 copies with 10% noise took 31% of a payout pool). Here replies whose updates
``d_i = W_i - W`` are nearly parallel, ``cos(d_i, d_j) > threshold``, are linked, and the
linked groups (connected components) become single players of a *quotient game*: the
group's members' updates are averaged into one update that plays once, and its value, its
aggregation weight and so its payout are split equally among the members (:func:`quotient`,
:func:`fedowen_strategy.round.contribution.value_round`). k copies then earn what one would.
Exact copies (``duplicate-tolerance``) are the special case ``cos = 1``; those are also
*banned* (never selected again, pay forfeited), which near-parallel honest updates are not.

The threshold (``link-cosine``) is taken from the distribution of honest pairs measured on
clean runs (docs/arena.md, "Sybil links"), not chosen by hand. An unchanged model (``d = 0``)
has no direction and is never linked: free riders are null players in the delta game already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.updates import State, combine, is_update, update_norm, within


def components(n: int, edges: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Connected components of two or more of the graph on ``0..n-1``, each sorted, ordered
    by their first member."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in edges:
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[0])


def link_groups(cosines: NDArray[np.float64], threshold: float) -> list[list[int]]:
    """Groups of updates linked by ``cos > threshold`` (0 turns linking off).

    Raises
    ------
    ValueError
        If ``threshold`` is outside ``[0, 1)``.
    """
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"link-cosine={threshold!r} must lie in [0, 1) (0 = off)")
    if threshold == 0.0:
        return []
    n = len(cosines)
    return components(n, [(i, j) for i in range(n) for j in range(i + 1, n)
                          if cosines[i, j] > threshold])


def merge_groups(n: int, *partitions: Sequence[Sequence[int]]) -> list[list[int]]:
    """The finest groups that contain every given group (their union as a graph)."""
    edges = [(g[0], m) for groups in partitions for g in groups for m in g[1:]]
    return components(n, edges)


def upper_triangle(cosines: NDArray[np.float64], digits: int = 4) -> list[float]:
    """The pairs ``i < j`` of a cosine matrix, row by row, rounded (for the round record)."""
    n = len(cosines)
    return [round(float(cosines[i, j]), digits) for i in range(n) for j in range(i + 1, n)]


# ------------------------------------------------------------------ links that last

#: A pair of client ids, in sorted order.
Pair = tuple[str, str]


def count_links(pair_links: Mapping[Pair, int], groups: Sequence[Sequence[str]]
                ) -> dict[Pair, int]:
    """``pair_links`` plus one for every pair of clients linked together in one round's
    ``groups`` (the round record's ``links``)."""
    out = dict(pair_links)
    for group in groups:
        members = sorted(set(group))
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                out[a, b] = out.get((a, b), 0) + 1
    return out


def lasting_groups(pair_links: Mapping[Pair, int], rounds: int) -> list[list[str]]:
    """Clients linked to each other in at least ``rounds`` rounds, as groups (connected
    components of those pairs), each sorted; none when ``rounds`` is 0.

    Within a round a link splits one player's phi among its members, but across rounds k
    identities carrying one update are still k arms of the bandit, so the update is selected
    about k times as often as one client's would be. Groups that last are one arm
    (:func:`fedowen_strategy.selectors.shared.link_arms`)."""
    if rounds <= 0:
        return []
    pairs = [p for p, n in pair_links.items() if n >= rounds]
    ids = sorted({c for p in pairs for c in p})
    index = {c: i for i, c in enumerate(ids)}
    return [[ids[i] for i in g]
            for g in components(len(ids), [(index[a], index[b]) for a, b in pairs])]


def quotient(states: Sequence[State], num_examples: Sequence[int],
             groups: Sequence[Sequence[int]]
             ) -> tuple[list[list[int]], list[dict[str, NDArray]], list[int]]:
    """The quotient game's players: each group of linked updates becomes one player whose
    state is its members' mean and whose example count is their mean (k copies count as one);
    the others stay as they are. Players are ordered by their first member. The update keys'
    mean is a step from the first member (:func:`fedowen_strategy.updates.combine`), the
    buffers' a float64 mean."""
    grouped = {i for g in groups for i in g}
    players = sorted([sorted(g) for g in groups] + [[i] for i in range(len(states))
                                                    if i not in grouped])
    merged = [dict(states[p[0]]) if len(p) == 1 else _mean_state([states[i] for i in p])
              for p in players]
    examples = [round(float(np.mean([num_examples[i] for i in p]))) for p in players]
    return players, merged, examples


def _mean_state(members: Sequence[State]) -> dict[str, NDArray]:
    """The members' mean state, key by key, in the first member's dtypes."""
    first = members[0]
    weights = [1.0 / len(members)] * len(members)
    return {key: combine(arr, [m[key] for m in members], weights) if is_update(key, arr) else
            np.mean([np.asarray(m[key], np.float64) for m in members], axis=0)
            .astype(np.asarray(arr).dtype) for key, arr in first.items()}


def split_among(values: NDArray[np.float64], players: Sequence[Sequence[int]]
                ) -> NDArray[np.float64]:
    """Each quotient player's value split equally among its members (indexed as the
    updates)."""
    out = np.zeros(sum(len(p) for p in players))
    for value, members in zip(values, players, strict=True):
        out[list(members)] = value / len(members)
    return out


#: The copies screen's allowance for the rounding of two update norms (relative).
NORM_SLACK = 1e-4


def duplicate_groups(states: Sequence[State], reference: State, tolerance: float,
                     norms: Sequence[float] | None = None) -> list[list[int]]:
    """Groups (of two or more) of near-duplicate updates: ``i`` and ``j`` are near-duplicates
    when ``||d_i - d_j|| <= tolerance * max(||d_i||, ||d_j||)`` for their deltas ``d`` to
    ``reference``; groups are connected components. An unchanged model (``d = 0``) is no one's
    copy: honest clients return one when the model already fits their data exactly (measured:
    one-class clients of a collapsed model, docs/results/duplicates/), and it is a null player
    in the delta game anyway.

    ``norms``: the updates' :func:`~fedowen_strategy.updates.update_norm` where the caller has
    them (computed unless given). A pair can be near-duplicates only if their norms differ by at
    most ``tolerance`` x the larger (the triangle inequality), so only pairs within that plus
    :data:`NORM_SLACK` (far above the norms' rounding, about 1e-8) are measured, and
    ``d_i - d_j = W_i - W_j`` is measured array by array, stopping at the first array that puts
    the pair beyond the tolerance: a pair that is no copy costs a few arrays, not a flat
    float64 copy of both updates (on ResNet-18's 11M entries those copies were most of a
    round's server time: benchmarks/bench_server_numpy.py)."""
    if tolerance <= 0 or len(states) < 2:
        return []
    norms = [update_norm(s, reference) for s in states] if norms is None else list(norms)
    n = len(states)
    near = [(i, j) for i in range(n) for j in range(i + 1, n) if norms[i] > 0 and norms[j] > 0
            and abs(norms[i] - norms[j]) <= (tolerance + NORM_SLACK) * max(norms[i], norms[j])]
    return components(n, [(i, j) for i, j in near if within(
        states[i], states[j], reference, tolerance * max(norms[i], norms[j]))])
