#!/usr/bin/env bash
# Set up the venv and run the checks: ruff, mypy, then pytest.
#   bash scripts/test.sh           fast mode: every test but the process-level ones (marked e2e)
#                                  and the long runs (marked slow)
#   bash scripts/test.sh --full    what CI runs (.ci/run): the fast tests plus every e2e test
#                                  (real flwr run + Ray, TLS deployment, kill-and-resume, signals)
# Other arguments go to pytest (e.g. `-m slow` for the long runs, `-k valuation`, `-m docker`
# for the federation in containers, docs/deployment.md section 7).
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
echo "[test] mypy" && "$VENV/bin/mypy" fedowen_strategy fedowen_task client_app server_app fedowen_deploy sim studies
MARKS=(-m "not slow and not e2e and not docker")
if [ "${1:-}" = "--full" ]; then
  shift
  MARKS=(-m "not slow and not docker")
fi
for arg in "$@"; do  # an explicit -m replaces the mode's selection
  if [ "$arg" = "-m" ]; then MARKS=(); fi
done
echo "[test] pytest ${MARKS[*]}" && exec "$VENV/bin/python" -m pytest "${MARKS[@]}" "$@"
