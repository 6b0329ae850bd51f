"""How far the behaviour guard's run drifts under each CPU kernel choice torch, oneDNN, MKL and
OpenBLAS offer on this machine: the measurement behind the guard's tolerances
(tests/test_behaviour_guard.py, issue 74).

Another x86-64 CPU runs the same commit with other kernels (AVX2 instead of AVX-512, another
BLAS code path), and ten rounds of SGD grow those last bits. The guard's run is repeated here
with each choice forced by the libraries' own switches (set before torch loads, in the cell's
child process), and every number is compared with the recorded copy round by round::

    PYTHONPATH=. python tests/guard_kernels.py DATA_DIR [--out drift.json]

prints, per kernel choice, the discrete differences (there should be none) and the largest
drift of a number in each round, ``|got - recorded| / max(1, |recorded|)``.

On an AMD EPYC with AVX2 and FMA, no AVX-512 (the kind of machine issue 74 failed on; its own
kernels are torch's and oneDNN's AVX2, OpenBLAS's Haswell), the guard's pinned run
(``--only native``, 2026-12-01) matched the copy recorded on the Intel machine with no
discrete difference and a largest drift of 5.6e-17 (round 3), 0 in rounds 9 and 10; unpinned
(``--only native --unpinned``) the same machine drifts 1.8e-5 by round 4 and 3.6e-2 by round
10, and in round 7 the value cap catches client 2 instead of client 1: issue 74's failure.

**The suite's other pinned numbers** (issue 74, deliver 2): every other test that compares a
float with a recorded copy, a hash or a number written into it, measured by
``PYTHONPATH=. python tests/pinned_kernels.py`` (each choice set before numpy and torch load)
on the same AMD EPYC, 2026-12-01. Largest drift from what the test compares with, under:
(a) native, (b) ``amd-like``, (c) ``torch-generic`` (``ATEN_CPU_CAPABILITY=default
ONEDNN_MAX_CPU_ISA=SSE41``), (d) ``avx2-both``, and two more: ``generic`` (all four libraries'
generic paths) and ``numpy-v2`` (OpenBLAS's Sandybridge kernels and numpy without its AVX2
loops, ``NPY_DISABLE_CPU_FEATURES=X86_V3``):

=========================  ============================  =========  =========================
test (what it compares)    with                          tolerance  drift (a) (b) (c) (d) gen v2
=========================  ============================  =========  =========================
test_selections_pinned     tests/data/selections.json:   1e-9 rel   0 in all six; no decision
(selected, selection;      13 scenarios x 20 rounds,                differs
losses, p-values)          each resumed at round 10
test_delta_code (draws,    PINNED_* literals (7b4f3d0)   ``==``     0 in all six
weights, masses)
test_valuation_accuracy    exact values of the recorded  band       0.0967 in all six, exact
(first-order error, the    game tables in tests/data     0.05-0.15  values bit-identical
unbiasedness t-tests)                                               (numpy only)
test_utility (batched vs   naive reference, same run     1e-5 abs   8.9e-8 8.9e-8 5.0e-8
naive, LeNet)              (accuracy: ``==``)                       8.9e-8 5.0e-8 8.9e-8;
                                                                    no accuracy differs
test_reports (sha256 of    the same cells archived       ``==``     bytes, no floats: passes
archive parts)             twice in the test                        in (a)-(d)
=========================  ============================  =========  =========================

Decision: all five portable as they are (no pin, no wider tolerance). The selections, DELTA
and valuation tests run numpy alone on closed-form games (no torch), and their bits did not
move under any choice, numpy's SIMD loops and OpenBLAS's kernels switched included;
test_utility compares two paths of one process, 100 times inside its tolerance. Under (a)-(d)
each file's pytest passes whole (27, 6, 37, 13 tests; test_utility's 17 under (a)-(c)). They still
catch a change of the size that matters: DELTA's score times (1 + 2e-16) fails
test_delta_code's pinned test, Power-of-Choice's losses times (1 + 1e-8) fail 4 of
test_selections_pinned's 27 (both one-line changes, reverted). Not measured, not at
risk by construction: the hand-computed numbers (test_delta, test_hics, test_peers,
test_byzantine, test_valuation_gtg, test_training: tolerances 1e-6 and up on closed forms),
the config hashes of test_protocol (hashes of run-config text, no computed float), and the
tests that compare two runs on one machine (test_resume, test_utility_memory,
test_valuation_workers: the same kernels on both sides). Not measurable here: AVX-512
(numpy's own AVX-512 exp and log, torch's AVX-512 kernels); the selections copy, recorded at
9bb6e1a in another session (its CPU not written down), matches this machine's bits.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: Kernel choices a machine of the project's kind can make, each as the switches that force it
#: here. "amd-like" is what an AMD EPYC without AVX-512 picks (torch's AVX2 kernels, oneDNN's
#: AVX2 ISA, MKL's AVX2 path, OpenBLAS's Haswell kernels).
KERNEL_CHOICES: Mapping[str, Mapping[str, str]] = {
    "native": {},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "onednn-sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "openblas-haswell": {"OPENBLAS_CORETYPE": "Haswell"},
    "avx2-both": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "amd-like": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                 "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OPENBLAS_CORETYPE": "Haswell"},
    "generic": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OPENBLAS_CORETYPE": "Prescott"},
}


def measure(data_dir: Path, choices: Mapping[str, Mapping[str, str]], pinned: bool,
            copy: Path) -> dict[str, object]:
    """Each choice's discrete differences and largest drift per round against the records in
    ``copy``; with ``pinned``, the choice's switches come first and the guard's own pin
    (:data:`~tests.test_behaviour_guard.PORTABLE_KERNELS`) over them."""
    from tests.test_behaviour_guard import PORTABLE_KERNELS, drift, read_records, run_guard
    want = read_records(copy)
    result: dict[str, object] = {}
    for name, env in choices.items():
        with tempfile.TemporaryDirectory() as tmp:
            run_guard(data_dir, Path(tmp), {**env, **(PORTABLE_KERNELS if pinned else {})})
            discrete, by_round = drift(read_records(Path(tmp)), want)
        result[name] = {"env": dict(env), "discrete": discrete,
                        "max_drift": {str(r): by_round[r] for r in sorted(by_round)}}
        worst = ", ".join(f"{r}: {by_round[r]:.1e}" for r in sorted(by_round))
        print(f"{name:18s} discrete {len(discrete)}  drift by round {worst}", flush=True)
    return {"machine": platform.processor() or platform.machine(), "choices": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="the offline datasets (../shared/data)")
    parser.add_argument("--out", type=Path, help="write the measurement as JSON here")
    parser.add_argument("--only", nargs="*", choices=list(KERNEL_CHOICES),
                        help="measure these choices only")
    parser.add_argument("--unpinned", action="store_true",
                        help="the run with the choice's kernels alone (not the guard's pin)")
    parser.add_argument("--copy", type=Path, help="compare with the records in this folder "
                        "(default: the guard's copy)")
    args = parser.parse_args()
    from tests.test_behaviour_guard import RECORDED
    choices = {k: KERNEL_CHOICES[k] for k in (args.only or KERNEL_CHOICES)}
    result = measure(args.data_dir.resolve(), choices, not args.unpinned,
                     args.copy or RECORDED)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
