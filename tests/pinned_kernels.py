"""How far the suite's other pinned numbers drift under each CPU kernel choice (issue 74): the
measurement behind the table in :mod:`tests.guard_kernels`.

Each kernel choice of :data:`tests.guard_kernels.KERNEL_CHOICES` (plus :data:`EXTRA_CHOICES`)
is set in a
child process before numpy and torch load, and the child measures, against what each test
compares with::

    PYTHONPATH=. python tests/pinned_kernels.py [--only native generic ...]

- ``selections``: tests/test_selections_pinned.py's 13 scenarios, 20 rounds and the 10 resumed
  ones, against tests/data/selections.json: discrete differences, largest relative drift of a
  number (the test allows 1e-9);
- ``delta_code``: tests/test_delta_code.py's scripted DELTA rounds against its pinned weights
  and masses (compared with ``==``): draws that differ, largest absolute drift;
- ``first_order``: tests/test_valuation_accuracy.py's first-order error on the recorded app
  game (its band 0.05-0.15) and the exact values' largest drift from the first choice's run
  (native, unless ``--only`` names another first);
- ``utility``: tests/test_utility.py's LeNet cases against the naive reference: largest
  ``|got - naive|`` of the loss (the test allows 1e-5) and accuracy values that differ.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Any

#: Beyond the guard's choices: torch's generic kernels with oneDNN's SSE4.1 (the rest native),
#: and numpy's baseline SIMD with OpenBLAS's Sandybridge kernels.
EXTRA_CHOICES = {"torch-generic": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
                 "numpy-v2": {"NPY_DISABLE_CPU_FEATURES": "X86_V3",
                              "OPENBLAS_CORETYPE": "Sandybridge"}}


def _walk(got: Any, want: Any) -> tuple[int, float]:
    """Discrete differences and the largest relative drift of a number between two records."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return 1, 0.0
        parts = [_walk(got[k], want[k]) for k in want]
    elif isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return 1, 0.0
        parts = [_walk(g, w) for g, w in zip(got, want, strict=True)]
    elif isinstance(want, float) and isinstance(got, float):
        same = got == want or (math.isnan(got) and math.isnan(want))
        return 0, 0.0 if same else abs(got - want) / max(abs(want), 1e-300)
    else:
        return int(got != want or type(got) is not type(want)), 0.0
    return sum(p[0] for p in parts), max((p[1] for p in parts), default=0.0)


def selections() -> dict[str, float]:
    from tests import test_selections_pinned as sel
    copy = sel.recorded()["scenarios"]
    discrete, worst = 0, 0.0
    for name in sel.SCENARIOS:
        want = copy[name]
        for got, rounds in ((sel.run(name)["rounds"], want["rounds"]),
                            (sel.run(name, sel.ROUNDS - sel.RESUME_AT, want["w"], want["state"],
                                     sel.RESUME_AT)["rounds"], want["rounds"][sel.RESUME_AT:])):
            d, w = _walk(got, rounds)
            discrete, worst = discrete + d, max(worst, w)
    return {"discrete": discrete, "max_rel_drift": worst}


def delta_code() -> dict[str, float]:
    from fedowen_strategy.selectors.delta import Delta, DeltaSettings
    from tests import test_delta_code as dc
    discrete, worst = 0, 0.0
    for settings in (DeltaSettings(), DeltaSettings(delta_score="paper",
                                                    delta_draw="with-replacement")):
        selector = Delta(settings)
        out = dc.scripted(selector)
        discrete += sum((ids, c) != p for (ids, c, _), p in zip(out, dc.PINNED_DRAWS, strict=True))
        weights = [abs(a - b) for (_, _, w), p in zip(out, dc.PINNED_WEIGHTS, strict=True)
                   for a, b in zip(w, p, strict=True)]
        mass = [abs(v - dc.PINNED_MASS[k]) for k, v in selector.state()["mass"].items()]
        worst = max(worst, *weights, *mass)
    return {"discrete": discrete, "max_abs_drift": worst}


def first_order() -> dict[str, Any]:
    import numpy as np

    from fedowen_strategy.valuation import estimate
    from tests import test_valuation_accuracy as va
    game = va.GAMES["app-mnist"]
    truth = va.exact_values(game, 10)
    result = estimate("first-order", game, 10, budget=20, seed=0)
    error = float(np.abs(result.values - truth).max() / np.abs(truth).max())
    return {"error": error, "exact": truth.tolist()}


def utility() -> dict[str, float]:
    import numpy as np

    from fedowen_strategy.torch_utility.batched import CoalitionGame
    from tests import test_utility as tu
    worst, flips = 0.0, 0
    for mode, forward in (("loop", "auto"), ("loop", "eager"), ("vmap", "auto")):
        for metric in ("accuracy", "neg-loss"):
            model, glob, clients, n_ex, x, y, rng = tu._setup("lenet", 5, 64)
            masks = tu._masks(5, 6, rng)
            got = CoalitionGame(model, glob, clients, n_ex, x, y, metric=metric, device="cpu",
                                mode=mode, batch_size=40, chunk_size=3, forward=forward)(masks)
            want = tu.naive_utility(model, glob, clients, n_ex, x, y, masks, metric)
            worst = max(worst, float(np.abs(got - want).max()))
            flips += int((got != want).sum()) if metric == "accuracy" else 0
    model, glob, clients, n_ex, x, y, rng = tu._setup("lenet", 8, 600, seed=4)
    masks = tu._masks(8, 10, rng)
    got = CoalitionGame(model, glob, clients, n_ex, x, y, device="cpu", metric="accuracy")(masks)
    flips += int((got != tu.naive_utility(model, glob, clients, n_ex, x, y, masks,
                                          "accuracy")).sum())
    return {"max_abs_drift": worst, "accuracy_flips": flips}


MEASURES = {"selections": selections, "delta_code": delta_code, "first_order": first_order,
            "utility": utility}


def child() -> None:
    print(json.dumps({name: fn() for name, fn in MEASURES.items()}))


def main() -> None:
    from tests.guard_kernels import KERNEL_CHOICES
    choices = {**KERNEL_CHOICES, **EXTRA_CHOICES}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(choices), help="these choices only")
    args = parser.parse_args()
    native: list[float] | None = None
    for name in args.only or choices:
        env = {**os.environ, **choices[name]}
        out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                             capture_output=True, text=True).stdout.splitlines()[-1]
        got = json.loads(out)
        exact = got["first_order"].pop("exact")
        native = native or exact
        got["first_order"]["exact_drift_vs_first"] = max(abs(a - b) for a, b in
                                                         zip(exact, native, strict=True))
        print(f"{name:16s} {json.dumps(got)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child()
    else:
        main()
