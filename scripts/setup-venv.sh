#!/usr/bin/env bash
# Build (once) the project's virtual environment and print its path on stdout.
# The venv lives outside the clone, keyed by the hash of requirements/lock.txt and the Python
# version, so fresh clones on the same machine share it and a changed pin builds a new one.
# Override the location with FEDOWEN_VENV, the interpreter with FEDOWEN_PYTHON.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FEDOWEN_PYTHON:-python3.11}"
LOCK="$ROOT/requirements/lock.txt"
command -v "$PY" >/dev/null || { echo "[setup] $PY not found: install Python 3.11 or set FEDOWEN_PYTHON" >&2; exit 2; }
KEY="$( { cat "$LOCK"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
VENV="${FEDOWEN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fedowen/venv-$KEY}"
if [ ! -f "$VENV/.fedowen-ready" ]; then
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  flock 9
  if [ ! -f "$VENV/.fedowen-ready" ]; then
    echo "[setup] building $VENV from requirements/lock.txt (first time only: torch takes minutes)" >&2
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --progress-bar off -r "$LOCK" >&2
    touch "$VENV/.fedowen-ready"
    echo "[setup] venv ready" >&2
  fi
fi
echo "$VENV"
