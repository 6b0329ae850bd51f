"""The app's behaviour, pinned: a fixed-seed 10-round run's records against a recorded copy.

A redesign that moves code between modules (issue 30) must leave every run unchanged. This
test runs the app's defaults (FedOwen, the delta game, norm cap and Sybil links on) for 10
rounds with colluding Sybils among the clients, so that selection, valuation, the norm cap,
the links and the quotient game all act, and compares the round records, the ledger and the
payouts with the copy in ``tests/data/behaviour_guard/``. Wall-clock fields (``*_seconds``) are
left out.

Every discrete field (who was selected, returned, linked, capped; the number of evaluations)
must match exactly, every number to within :data:`ABS_TOL` (or :data:`REL_TOL` of its size;
the payouts file prints six decimals, so its last digit may move).
Bit-identity is a property of one machine, not of the code: the same commit gives other last
bits on another CPU (the guard once pinned a SHA-256, recorded on an Intel machine; on this
project's AMD EPYC machines its numbers differ by under 1e-6, its decisions not at all; so
did 15 more runs here under other instruction sets for torch, MKL and oneDNN, e.g.
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``, which pass this test too).
The copy was recorded at 49be9f2, whose app code is the code that passed the hashed guard;
each round's ``selection`` field (how Algorithm 2 chose, its extra messages) was added to it
when the shared selection began to record every selector's cost, from a run of that
commit whose every other field matched the copy.
Re-recorded at 0ac2020 (from a run of that commit), where the default selection (``auto``
with a valuation that computes phi) changed from Algorithm 2 (``adaptive``) to ``hics-phi``,
as selection-peers-dev's rule adopts (conf/selection-peers-dev.toml, step 4): its selections,
and so the values, weights and accuracies of every round, differ from the earlier copy by
design; the same run with ``selection = "adaptive"`` still reproduced the earlier copy, its
records, ledger and payouts, with no difference at that commit.

If this fails after a change that was *meant* to change behaviour, say so in the commit and
record the new copy (``PYTHONPATH=. python tests/test_behaviour_guard.py --record DATA_DIR``);
a change that was not meant to, is a bug.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from sim.inline import inline_run

GUARD_CONFIG = {"dataset": "mnist", "num-server-rounds": 10, "clients-per-round": 6,
                "client-max-samples": 100, "test-max-samples": 300, "seed": 3,
                "adversary-kind": "colluding-sybil", "adversary-fraction": 0.25}
GUARD_SUPERNODES = 12
RECORDED = Path(__file__).parent / "data" / "behaviour_guard"
ABS_TOL = 1e-5  # platform noise: under 1e-6 in the records; payouts.csv rounds to 6 decimals
REL_TOL = 1e-5


def without_seconds(value: Any) -> Any:
    """``value`` without wall-clock fields (keys ending in ``_seconds``) at any depth."""
    if isinstance(value, dict):
        return {k: without_seconds(v) for k, v in value.items() if not k.endswith("_seconds")}
    return value


def canonical_rounds(path: Path) -> str:
    """rounds.jsonl without wall-clock fields, each record with sorted keys, one per line."""
    lines = [json.dumps(without_seconds(json.loads(line)), sort_keys=True)
             for line in path.read_text().splitlines()]
    return "\n".join(lines) + "\n"


def differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where two decoded records differ: any discrete value or structure, or a number beyond
    the tolerance; numbers read from CSV text are compared as numbers."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(set(got) ^ set(want))}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items, recorded {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, f"{path}[{i}]")]
    g, w = _number(got), _number(want)
    if g is not None and w is not None and not isinstance(want, bool):
        ok = math.isclose(g, w, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    else:
        ok = got == want
    return [] if ok else [f"{path}: {got!r}, recorded {want!r}"]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(value) if isinstance(value, str) and value else None
    except ValueError:
        return None


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_the_comparison_tells_platform_noise_from_a_change() -> None:
    # Prepare: a recorded round, the same with float noise, and three real changes
    want = {"round": 1, "selected": ["3", "7"], "phi": {"3": 0.125, "7": -0.5}, "n_evals": 40}
    noise = {**want, "phi": {"3": 0.125 + 3e-7, "7": -0.5 - 4e-7}}
    # Execute / Assert
    assert differences(noise, want) == []
    assert differences({**want, "phi": {"3": 0.1251, "7": -0.5}}, want) == [
        ".phi.3: 0.1251, recorded 0.125"]
    assert differences({**want, "selected": ["3", "8"]}, want) == [
        ".selected[1]: '8', recorded '7'"]
    assert differences({**want, "n_evals": 41}, want) == [".n_evals: 41, recorded 40"]
    assert differences([{"a": "0.1250001"}], [{"a": "0.125"}]) == []  # CSV text as numbers
    assert differences([{"a": "True"}], [{"a": "False"}]) == ["[0].a: 'True', recorded 'False'"]


def test_a_fixed_seed_run_records_the_same_rounds_as_before(shared_data_dir: Path,
                                                            tmp_path: Path) -> None:
    # Prepare
    cfg = {**GUARD_CONFIG, "data-dir": str(shared_data_dir), "output-dir": str(tmp_path)}
    # Execute
    outcome = inline_run(None, cfg, num_supernodes=GUARD_SUPERNODES, timeout=600)
    # Assert: ten rounds, and the records, ledger and payouts as recorded
    assert outcome.ok, outcome.output[-3000:]
    got = [json.loads(line) for line in canonical_rounds(tmp_path / "rounds.jsonl").splitlines()]
    want = [json.loads(line) for line in (RECORDED / "rounds.jsonl").read_text().splitlines()]
    assert len(got) == 11  # round 0 (the initial model) and rounds 1-10
    assert differences(got, want) == []
    for name in ("ledger.csv", "payouts.csv"):
        assert differences(read_csv(tmp_path / name), read_csv(RECORDED / name)) == [], name


def record(data_dir: Path) -> None:
    """Run the guard's configuration and keep its records as the new copy."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {**GUARD_CONFIG, "data-dir": str(data_dir.resolve()), "output-dir": tmp}
        outcome = inline_run(None, cfg, num_supernodes=GUARD_SUPERNODES, timeout=600)
        if not outcome.ok:
            raise SystemExit(outcome.output[-3000:])
        (RECORDED / "rounds.jsonl").write_text(canonical_rounds(Path(tmp) / "rounds.jsonl"))
        for name in ("ledger.csv", "payouts.csv"):
            shutil.copyfile(Path(tmp) / name, RECORDED / name)
    print(f"recorded {RECORDED}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--record":
        raise SystemExit("usage: PYTHONPATH=. python tests/test_behaviour_guard.py --record "
                         "DATA_DIR (the offline datasets, e.g. ../shared/data)")
    record(Path(sys.argv[2]))
