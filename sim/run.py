"""``python -m sim.run``: the old name of the product's command line, :mod:`fedowen_deploy.cli`
(where it lives now; ``scripts/run.sh`` runs it)."""

from __future__ import annotations

from fedowen_deploy.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
