"""The server's numpy work on a large model's round: the copy screen and the cosines, before
and after they share one Gram matrix.

Ten ResNet-18 replies (11.2M update entries each; one of them a near-copy of another, within
``duplicate-tolerance``) against their global model. Timed, in rotating order, each repeat:

- ``pairwise`` (the baseline: the code before, inlined here): every update as a flat float64
  delta, stacked into one ``(10, 11.2M)`` array, the distance of every pair measured on it,
  then the cosines' Gram matrix built a second time with a fresh block per array;
- ``gram``: :func:`fedowen_strategy.updates.gram_matrix` once (one reused buffer), the copy
  screen on it (:func:`fedowen_strategy.defences.links.duplicate_groups`: only pairs near the
  tolerance measured on flat deltas) and the cosines from the same matrix;
- ``guard_round``: the whole of the default guards on the round (norm cap, value cap, copies,
  links), for scale.

Checked, not only timed: both ways find the same copy groups and the same cosine matrix (bit
for bit).

    PYTHONPATH=. python -m benchmarks.bench_server_numpy --repeats 3 \\
        --out-json docs/results/server-numpy/bench.json --out-md docs/results/server-numpy/bench.md
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from benchmarks._common import (
    load_average,
    machine_info,
    markdown_table,
    rotated,
    summarise,
    timed,
    write_outputs,
)
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.guards import guard_round
from fedowen_strategy.defences.links import components, duplicate_groups
from fedowen_strategy.replies import ClientUpdate
from fedowen_strategy.updates import cosine_matrix, flat_deltas, gram_matrix, is_update
from fedowen_task.models import build_model, state_to_numpy

State = Mapping[str, NDArray]


def replies(n: int, seed: int) -> tuple[dict[str, NDArray], list[dict[str, NDArray]]]:
    """ResNet-18's initial state and ``n`` perturbed copies of it; the last a near-copy of the
    first (relative distance 1e-8, under the default tolerance 1e-6)."""
    glob = state_to_numpy(build_model("resnet18", 3, 10, seed=seed))
    rng = np.random.default_rng(seed)
    states = [{k: v + rng.normal(0, 0.01, v.shape).astype(v.dtype) if is_update(k, v)
               else v.copy() for k, v in glob.items()} for _ in range(n - 1)]
    states.append({k: v + (v - glob[k]) * 1e-8 if is_update(k, v) else v.copy()
                   for k, v in states[0].items()})
    return glob, states


def pairwise(states: Sequence[State], glob: State, tolerance: float
             ) -> tuple[list[list[int]], NDArray[np.float64]]:
    """The code before: flat stacked deltas, every pair measured; a fresh Gram for cosines."""
    deltas = flat_deltas(states, glob)
    norms = np.linalg.norm(deltas, axis=1)
    n = len(states)
    copies = components(n, [(i, j) for i in range(n) for j in range(i + 1, n)
                            if norms[i] > 0 and norms[j] > 0
                            and np.linalg.norm(deltas[i] - deltas[j])
                            <= tolerance * max(norms[i], norms[j])])
    gram = np.zeros((n, n))
    for key, ref in glob.items():
        if is_update(key, ref):
            block = np.stack([(np.asarray(s[key], np.float64) - ref).ravel() for s in states])
            gram += block @ block.T
    return copies, cosine_matrix(states, glob, gram)


def shared_gram(states: Sequence[State], glob: State, tolerance: float
                ) -> tuple[list[list[int]], NDArray[np.float64]]:
    """Today's: one Gram matrix for the copy screen and the cosines."""
    gram = gram_matrix(states, glob)
    return duplicate_groups(states, glob, tolerance, gram), cosine_matrix(states, glob, gram)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    args = p.parse_args(argv)
    glob, states = replies(args.clients, args.seed)
    tolerance = Guards().duplicate_tolerance
    updates = [ClientUpdate(node_id=i, client_id=str(i), state=s, num_examples=100,
                            train_loss=1.0) for i, s in enumerate(states)]
    jobs = {"pairwise": lambda: pairwise(states, glob, tolerance),
            "gram": lambda: shared_gram(states, glob, tolerance),
            "guard_round": lambda: guard_round(updates, glob, Guards(), norm_cap="median",
                                               value_players=True)}
    times: dict[str, list[float]] = {name: [] for name in jobs}
    results: dict[str, object] = {}
    for r in range(args.repeats):
        for name in rotated(list(jobs), r):
            seconds, results[name] = timed(jobs[name])
            times[name].append(seconds)
    (old_copies, old_cos), (new_copies, new_cos) = results["pairwise"], results["gram"]
    same = old_copies == new_copies and bool(np.array_equal(old_cos, new_cos))
    if not same or new_copies != [[0, args.clients - 1]]:
        raise SystemExit(f"the two ways differ: copies {old_copies} vs {new_copies}, "
                         f"cosines equal: {np.array_equal(old_cos, new_cos)}")
    best = {name: summarise(t, "min") for name, t in times.items()}
    rows = [[name, f"{best[name]:.2f}", " ".join(f"{t:.2f}" for t in times[name]),
             f"{best['pairwise'] / best[name]:.1f}x"] for name in jobs]
    table = markdown_table(["job", "seconds (min)", "repeats", "pairwise / job"], rows)
    payload = {"machine": machine_info(), "load_after": load_average(), "seconds": times,
               "copies": new_copies, "same_decisions_and_cosines": same,
               "entries": int(sum(v.size for k, v in glob.items() if is_update(k, v)))}
    write_outputs(payload, table, args.out_json, args.out_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
