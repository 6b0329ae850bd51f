#!/usr/bin/env bash
# Set up the venv and run a FedOwen simulation with a real `flwr run` (Ray):
# 100 virtual clients on MNIST, 10 per round. Arguments go to `python -m fedowen_deploy.cli`
# (e.g. --rounds 2, --valuation mc-shapley, --set alpha=0.01; --help lists them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup-venv.sh")"
cd "$ROOT"
exec env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m fedowen_deploy.cli "$@"
