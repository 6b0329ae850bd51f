"""The server's non-valuation work on a ResNet-18 round, float64 (before) and float32 (now).

Ten ResNet-18 replies (11.2M update entries each; one boosted 5x, so the norm cap clips it;
the last a near-copy of the first, within ``duplicate-tolerance``) against their global model.
Timed, in rotating order, each repeat, the whole of what the server does to a round's replies
outside the valuation (wall seconds, and this process's CPU seconds, which a shared machine's
load inflates less) at the app's defaults (``max-norm-ratio`` 10, ``norm-cap`` median x 2,
``value-cap-multiple`` 1 ``exactly``, the copies check, the links), then the aggregate:

- ``float64`` (the baseline: the code before issue 70, inlined here): the reply checks, the
  norms, the clipped states, the Gram matrix and the aggregate in float64 copies of every
  array; the copies screened on the Gram matrix and measured on flat float64 deltas;
- ``float32``: the library now (:mod:`fedowen_strategy.updates`: the model's own float type,
  sums arranged as its docstring states): the reply check as ``parse_replies`` makes it (the
  global norm measured once, each update's norm kept for the guards), :func:`~fedowen_strategy.
  defences.guards.guard_round`, :func:`~fedowen_strategy.round.aggregation.weighted_average`.

Checked, not only timed, on ResNet-18 and on LeNet-5 (the behaviour guard's model; the small
CNN has LeNet-5's arrays): both ways reject, clip, group as copies and link the same clients,
and the report gives how far the numbers moved (the norm cap, the cosines, the valued states
and the aggregate: the largest difference in units of float32's last place at the size of the
entry's largest input, and the share of entries with the same bits). Issue 59's version of
this file (the copy screen before and after one Gram matrix) is at commit d89da15, its numbers
in ``bench.json`` / ``bench.md`` beside these.

    PYTHONPATH=. python -m benchmarks.bench_server_numpy --repeats 2 \\
        --out-json docs/results/server-numpy/f32.json --out-md docs/results/server-numpy/f32.md
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import Any

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
from fedowen_strategy.defences.bounds import lower_median
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.guards import guard_round
from fedowen_strategy.defences.links import components, link_groups
from fedowen_strategy.replies import ClientUpdate, _measure
from fedowen_strategy.round.aggregation import weighted_average
from fedowen_strategy.updates import cosine_matrix, gram_cosines, is_update, model_norm
from fedowen_task.models import build_model, state_to_numpy

State = Mapping[str, NDArray]


def replies(model: str, n: int, seed: int) -> tuple[dict[str, NDArray], list[dict[str, NDArray]]]:
    """``model``'s initial state and ``n`` perturbed copies of it: the second boosted 5x, the
    last a near-copy of the first (relative distance 1e-8, under the default tolerance 1e-6)."""
    channels = 3 if model == "resnet18" else 1
    glob = state_to_numpy(build_model(model, channels, 10, seed=seed))
    rng = np.random.default_rng(seed)
    states = [{k: v + (5.0 if i == 1 else 1.0) * rng.normal(0, 0.01, v.shape).astype(v.dtype)
               if is_update(k, v) else v.copy() for k, v in glob.items()} for i in range(n - 1)]
    states.append({k: v + (v - glob[k]) * 1e-8 if is_update(k, v) else v.copy()
                   for k, v in states[0].items()})
    return glob, states


# ------------------------------------------------------------ the float64 code, inlined

def _norm64(state: State, ref: State) -> float:
    return float(np.sqrt(sum(float(np.sum(np.square(state[k].astype(np.float64) - r)))
                             for k, r in ref.items() if is_update(k, r))))


def _check64(state: State, ref: State, ratio: float) -> bool:
    """The reply check before: finite, variances, the global norm measured per reply."""
    ref_sq, upd_sq = 0.0, 0.0
    for key, r in ref.items():
        arr = state[key]
        if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
            return False
        if key.endswith("running_var") and np.any(arr < 0):
            return False
        if is_update(key, r):
            ref_sq += float(np.sum(np.square(r, dtype=np.float64)))
            upd_sq += float(np.sum(np.square(arr.astype(np.float64) - r)))
    return bool(np.sqrt(upd_sq) <= ratio * np.sqrt(ref_sq))


def _clip64(state: State, ref: State, factor: float) -> dict[str, NDArray]:
    return {k: (r + factor * (state[k].astype(np.float64) - r)).astype(r.dtype)
            if is_update(k, r) else state[k] for k, r in ref.items()}


def _cap64(states: list[dict[str, NDArray]], ref: State, cap: float, norms: list[float],
           exactly: bool) -> tuple[list[dict[str, NDArray]], dict[int, float]]:
    out, clipped = [], {}
    for i, (s, nm) in enumerate(zip(states, norms, strict=True)):
        if nm == 0 or nm == cap or (nm < cap and not exactly):
            out.append(s)
            continue
        clipped[i] = cap / nm
        out.append(_clip64(s, ref, cap / nm))
    return out, clipped


def _gram64(states: Sequence[State], ref: State) -> NDArray[np.float64]:
    n = len(states)
    keys = [k for k, r in ref.items() if is_update(k, r)]
    gram, buffer = np.zeros((n, n)), np.empty(n * max(ref[k].size for k in keys))
    for key in keys:
        r = ref[key].reshape(-1)
        block = buffer[:n * r.size].reshape(n, r.size)
        for row, s in zip(block, states, strict=True):
            np.subtract(s[key].reshape(-1), r, out=row, dtype=np.float64)
        gram += block @ block.T
    return gram


def _copies64(states: Sequence[State], ref: State, tol: float, gram: NDArray[np.float64]
              ) -> list[list[int]]:
    keys = [k for k, r in ref.items() if is_update(k, r)]
    screen = tol ** 2 + 8 * sum(ref[k].size for k in keys) * float(np.finfo(np.float64).eps)
    sq, n = np.diag(gram), len(states)
    near = [(i, j) for i in range(n) for j in range(i + 1, n) if sq[i] > 0 and sq[j] > 0
            and sq[i] + sq[j] - 2 * gram[i, j] <= screen * max(sq[i], sq[j])]
    flat = {i: np.concatenate([(states[i][k].astype(np.float64) - ref[k]).ravel() for k in keys])
            for i in sorted({i for p in near for i in p})}
    return components(n, [(i, j) for i, j in near if np.linalg.norm(flat[i] - flat[j])
                          <= tol * max(np.linalg.norm(flat[i]), np.linalg.norm(flat[j]))])


def _average64(states: Sequence[State], weights: NDArray[np.float64]) -> dict[str, NDArray]:
    out = {}
    for key, first in states[0].items():
        acc = np.zeros(first.shape)
        for w, s in zip(weights, states, strict=True):
            acc += w * s[key]
        out[key] = acc.astype(first.dtype)
    return out


def round64(states: list[dict[str, NDArray]], ref: State, guards: Guards) -> dict[str, Any]:
    """The server's non-valuation work on a round, as it was before issue 70."""
    accepted = [s for s in states if _check64(s, ref, guards.max_norm_ratio)]
    norms = [_norm64(s, ref) for s in accepted]
    median = lower_median(norms)
    cap = guards.norm_cap_multiple * median if median else None
    capped, clipped = _cap64(accepted, ref, cap, norms, False) if cap else (accepted, {})
    valued: list[dict[str, NDArray]] = capped
    if median and guards.value_cap_multiple > 0:
        value_norms = [_norm64(s, ref) for s in capped]  # measured again, as it was
        valued, _ = _cap64(capped, ref, guards.value_cap_multiple * median, value_norms, True)
    gram = _gram64(capped, ref)
    cosines = gram_cosines(gram)
    return {"accepted": len(accepted), "norm_cap": cap, "capped": clipped,
            "copies": _copies64(capped, ref, guards.duplicate_tolerance, gram),
            "links": link_groups(cosines, guards.link_cosine), "cosines": cosines,
            "valued": valued,
            "average": _average64(capped, np.full(len(capped), 1.0 / len(capped)))}


def round32(states: list[dict[str, NDArray]], ref: State, guards: Guards) -> dict[str, Any]:
    """The same with the library now."""
    global_norm = model_norm(ref)
    measured = [_measure(s, ref, guards.max_norm_ratio, global_norm) for s in states]
    accepted = [ClientUpdate(node_id=i, client_id=str(i), state=s, num_examples=100,
                             train_loss=1.0, norm=m) for i, (s, m) in enumerate(
                                 zip(states, measured, strict=True)) if not isinstance(m, str)]
    out = guard_round(accepted, ref, guards, norm_cap="median", value_players=True)
    states_out = [u.state for u in out.updates]
    return {"accepted": len(accepted), "norm_cap": out.record.get("norm_cap"),
            "capped": {int(c): f for c, f in out.record.get("capped", {}).items()},
            "copies": [[int(c) for c in g] for g in out.copies],
            "links": [[int(c) for c in g] for g in out.links], "states": states_out,
            "valued": out.valued,
            "average": weighted_average(states_out, np.full(len(states_out),
                                                             1.0 / len(states_out)))}


def _ulps(got: Sequence[State], want: Sequence[State], inputs: Sequence[State], ref: State
          ) -> dict[str, float]:
    """How far float32 states are from the float64 way's: the largest difference in units of
    the last place of the entry's largest input (``ref`` and ``inputs``), and the share of
    entries with the same bits."""
    worst, same, total = 0.0, 0, 0
    for key, r in ref.items():
        if not is_update(key, r):
            continue
        size = np.abs(r)
        for s in inputs:
            size = np.maximum(size, np.abs(s[key]))
        unit = np.spacing(size.astype(r.dtype)).astype(np.float64)
        for g, w in zip(got, want, strict=True):
            gap = np.abs(g[key].astype(np.float64) - w[key])
            worst = max(worst, float((gap / unit).max()))
            same, total = same + int(np.count_nonzero(gap == 0)), total + gap.size
    return {"max_ulps": worst, "same_bits": same / max(total, 1)}


def compare(old: dict[str, Any], new: dict[str, Any], ref: State, states: Sequence[State]
            ) -> dict[str, Any]:
    """The decisions of both ways (must match) and how far their numbers moved."""
    decisions = {k: (old[k], new[k]) for k in ("accepted", "copies", "links")}
    decisions["capped"] = (sorted(old["capped"]), sorted(new["capped"]))
    moved = {k: v for k, v in decisions.items() if v[0] != v[1]}
    cap_rel = (abs(new["norm_cap"] - old["norm_cap"]) / old["norm_cap"]
               if old["norm_cap"] else 0.0)
    factors = max((abs(new["capped"][c] - f) / f for c, f in old["capped"].items()
                   if c in new["capped"]), default=0.0)
    cosines = float(np.abs(cosine_matrix(new["states"], ref) - old["cosines"]).max())
    return {"same_decisions": not moved, "moved": {k: [str(x) for x in v]
                                                   for k, v in moved.items()},
            "copies": new["copies"], "capped": sorted(new["capped"]),
            "norm_cap_relative": cap_rel, "clip_factor_relative": factors,
            "cosines_abs": cosines,
            "valued": _ulps(new["valued"], old["valued"], states, ref),
            "average": _ulps([new["average"]], [old["average"]], states, ref)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    args = p.parse_args(argv)
    guards, info = Guards(), machine_info()
    checks: dict[str, Any] = {}
    for model in ("lenet",):  # the behaviour guard's model: decisions, not seconds
        glob, states = replies(model, args.clients, args.seed)
        checks[model] = compare(round64(states, glob, guards), round32(states, glob, guards),
                                glob, states)
    glob, states = replies("resnet18", args.clients, args.seed)
    jobs = {"float64": lambda: round64(states, glob, guards),
            "float32": lambda: round32(states, glob, guards)}
    times: dict[str, list[float]] = {name: [] for name in jobs}
    cpu: dict[str, list[float]] = {name: [] for name in jobs}  # this process's CPU seconds
    results: dict[str, Any] = {}
    for r in range(args.repeats):
        for name in rotated(list(jobs), r):
            start = time.process_time()
            seconds, results[name] = timed(jobs[name])
            times[name].append(seconds)
            cpu[name].append(time.process_time() - start)
    checks["resnet18"] = compare(results["float64"], results["float32"], glob, states)
    if not all(c["same_decisions"] for c in checks.values()) or \
            checks["resnet18"]["copies"] != [[0, args.clients - 1]]:
        raise SystemExit(f"the two ways decide differently: {checks}")
    best = {name: summarise(t, "min") for name, t in times.items()}
    best_cpu = {name: summarise(t, "min") for name, t in cpu.items()}
    rows = [[name, f"{best[name]:.2f}", " ".join(f"{t:.2f}" for t in times[name]),
             f"{best['float64'] / best[name]:.1f}x", f"{best_cpu[name]:.2f}",
             f"{best_cpu['float64'] / best_cpu[name]:.1f}x"] for name in jobs]
    table = markdown_table(["job (10 ResNet-18 replies)", "seconds (min)", "repeats",
                            "float64 / job", "CPU seconds (min)", "float64 / job (CPU)"], rows)
    table += "\n" + markdown_table(
        ["model", "same decisions", "norm cap (rel.)", "cosines (abs.)",
         "valued: max ulps / same bits", "aggregate: max ulps / same bits"],
        [[m, c["same_decisions"], f"{c['norm_cap_relative']:.1e}", f"{c['cosines_abs']:.1e}",
          f"{c['valued']['max_ulps']:.0f} / {c['valued']['same_bits']:.1%}",
          f"{c['average']['max_ulps']:.0f} / {c['average']['same_bits']:.1%}"]
         for m, c in checks.items()])
    payload = {"machine": info, "load_after": load_average(), "seconds": times,
               "cpu_seconds": cpu, "ratio_min": best["float64"] / best["float32"],
               "cpu_ratio_min": best_cpu["float64"] / best_cpu["float32"], "checks": checks,
               "entries": int(sum(v.size for k, v in glob.items() if is_update(k, v)))}
    write_outputs(payload, table, args.out_json, args.out_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
