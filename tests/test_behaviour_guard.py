"""The app's behaviour, pinned: a fixed-seed 10-round run's rounds.jsonl, hashed.

A redesign that moves code between modules (issue 30) must leave every run bit-identical. This
test runs the app's defaults (FedOwen, the delta game, norm cap and Sybil links on) for 10
rounds with colluding Sybils among the clients, so that selection, valuation, the norm cap,
the links and the quotient game all act, and compares the round records, the ledger and the
payouts with the hashes recorded before the redesign. Wall-clock fields (``*_seconds``) are
left out of the hash.

If this fails after a change that was *meant* to change behaviour, say so in the commit and
record the new hash; a change that was not meant to, is a bug.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sim.inline import inline_run

GUARD_CONFIG = {"dataset": "mnist", "num-server-rounds": 10, "clients-per-round": 6,
                "client-max-samples": 100, "test-max-samples": 300, "seed": 3,
                "adversary-kind": "colluding-sybil", "adversary-fraction": 0.25}
GUARD_SUPERNODES = 12
#: sha256 of the canonical rounds.jsonl, and of the ledger and payout files as written (main
#: b8b22cf, before issue 30's redesign).
GUARD_HASH = "5fc3305d26b069c0abb7946df17f646bc6496ff165727914b63dca5b949b2363"
GUARD_FILES = {"ledger.csv": "4b916fb0752e3daab6e761ce1d4ef10f5503ffa82a049da88490ca9d39e0d475",
               "payouts.csv": "85e6c46f0ef2d962a77be8a9dee286f3febb056bc6d336a9ac788c25903ffeec"}


def canonical_rounds(path: Path) -> str:
    """rounds.jsonl without wall-clock fields, each record with sorted keys, one per line."""
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        kept = {k: v for k, v in record.items() if not k.endswith("_seconds")}
        lines.append(json.dumps(kept, sort_keys=True))
    return "\n".join(lines) + "\n"


def test_a_fixed_seed_run_records_the_same_rounds_as_before(shared_data_dir: Path,
                                                            tmp_path: Path) -> None:
    # Prepare
    cfg = {**GUARD_CONFIG, "data-dir": str(shared_data_dir), "output-dir": str(tmp_path)}
    # Execute
    outcome = inline_run(None, cfg, num_supernodes=GUARD_SUPERNODES, timeout=600)
    # Assert: ten rounds, and the records, ledger and payouts hash as they did before
    assert outcome.ok, outcome.output[-3000:]
    text = canonical_rounds(tmp_path / "rounds.jsonl")
    assert len(text.splitlines()) == 11  # round 0 (the initial model) and rounds 1-10
    assert hashlib.sha256(text.encode()).hexdigest() == GUARD_HASH
    for name, digest in GUARD_FILES.items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest, name
