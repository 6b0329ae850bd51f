"""``python -m sim.ledger RUN_DIR [--out DIR]``: a run's payout ledger as CSV and PNG.

Works on any run dir whose ``rounds.jsonl`` records phi (FedOwen with any valuation method);
the computation and its confidence intervals are :mod:`fedowen_strategy.payouts`'.
Adversaries are marked when known: the run's ``adversaries.json`` (written by the ServerApp
when ``adversary-fraction > 0``), ``--adversaries 3,17,...``, or for older runs
``--num-partitions N`` (recomputed from the run's ``config.json``: fraction and seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from server_app.config import RunConfig
from server_app.run_plots import plot_payouts
from server_app.store.payouts import PAYOUTS_FILE, run_payouts, write_payouts

PNG_FILE = "payouts.png"


def adversaries_from_config(run_dir: Path, num_partitions: int) -> list[str]:
    """Adversary ids of an older run (no ``adversaries.json``) from its ``config.json``."""
    recorded = json.loads((run_dir / "config.json").read_text())  # the app's fields, as written
    cfg = RunConfig(**{k: v for k, v in recorded.items() if k in RunConfig.__dataclass_fields__})
    return [str(i) for i in sorted(cfg.adversary().ids(num_partitions))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.ledger", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a run's output dir (with rounds.jsonl)")
    parser.add_argument("--out", type=Path, help="where to write (default: the run dir)")
    parser.add_argument("--field", default="phi", choices=("phi", "phi_raw"),
                        help="phi on the run's phi-scale (default) or raw utility gains")
    parser.add_argument("--adversaries", help="comma-separated client ids to mark")
    parser.add_argument("--num-partitions", type=int,
                        help="recompute the adversaries of an older run from its config.json")
    args = parser.parse_args(argv)
    adversaries = None
    if args.adversaries:
        adversaries = [a.strip() for a in args.adversaries.split(",") if a.strip()]
    elif args.num_partitions:
        adversaries = adversaries_from_config(args.run_dir, args.num_partitions)
    try:
        rows = run_payouts(args.run_dir, args.field, adversaries)
    except (ValueError, OSError) as err:
        print(f"sim.ledger: {err}", file=sys.stderr)
        return 2
    out = args.out or args.run_dir
    csv_path = write_payouts(rows, out / PAYOUTS_FILE)
    png = plot_payouts(rows, out / PNG_FILE, title=f"{args.run_dir.name}: {args.field}")
    flagged = [r.client_id for r in rows if r.ci_below_zero]
    print(f"{len(rows)} clients; CI wholly below zero: {', '.join(flagged) or 'none'}")
    print(f"wrote {csv_path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
