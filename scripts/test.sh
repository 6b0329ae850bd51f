#!/usr/bin/env bash
# Set up the venv and run the checks: ruff, mypy, then the default pytest suite (which
# includes a real `flwr run` end-to-end test). Extra arguments go to pytest
# (e.g. `-m slow` for the long runs, `-k valuation`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup-venv.sh")"
cd "$ROOT"
if [ -z "${FEDOWEN_DATA:-}" ] && [ -d "$ROOT/../shared/data" ]; then
  export FEDOWEN_DATA="$(cd "$ROOT/../shared/data" && pwd)"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
echo "[test] ruff" && "$VENV/bin/ruff" check .
echo "[test] mypy" && "$VENV/bin/mypy" fedowen_strategy fedowen_task client_app server_app sim
echo "[test] pytest" && exec "$VENV/bin/python" -m pytest "$@"
