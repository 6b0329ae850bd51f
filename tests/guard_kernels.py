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
