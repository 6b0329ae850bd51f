#!/usr/bin/env bash
# Set up the venv and run an experiment preset: every cell a real `flwr run` (Ray), resumable.
#   scripts/experiment.sh run conf/paper-mnist-cpu.toml      # rerun to continue after a stop
#   scripts/experiment.sh status conf/paper-mnist-cpu.toml
#   scripts/experiment.sh report conf/paper-mnist-cpu.toml   # -> docs/results/<preset>
# Arguments go to `python -m sim.experiments` (--help lists them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup-venv.sh")"
cd "$ROOT"
exec env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m sim.experiments "$@"
