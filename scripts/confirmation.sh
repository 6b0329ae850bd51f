#!/usr/bin/env bash
# Run (or go on with) the confirmation's cells of one dataset on a fresh machine, as the protocol
# says: from a clean worktree of the protocol commit, on top of what the committed report holds.
#   scripts/confirmation.sh fashion-mnist          # one cell at a time
#   JOBS=2 scripts/confirmation.sh cifar10         # two at once (one core each)
#   scripts/confirmation.sh mnist --limit 0        # set up and count, run nothing (more
#                                                  # arguments go to the runner)
# Steps: (1) the worktree ($FEDOWEN_WORKTREE, default ../confirm) at the protocol commit, made
# when missing; (2) the results dir ($FEDOWEN_RESULTS, default ../runs/confirm-<dataset>) gets the
# committed tuning cells (archives/confirm-<dataset>/, when git has them) and every finished cell of
# the committed per-round CSVs, with its config and code records (`run --carry`, from this
# checkout: the protocol commit predates it); (3) the protocol commit's runner runs the rest.
# Kill it at any time; the same command goes on. Then, from this checkout:
#   scripts/experiment.sh report conf/confirm/<dataset>.toml --results <results> --archive
#   python -m sim.confirmation check conf/confirm/<dataset>.toml --results <results>
#   python -m sim.confirmation report          # docs/confirmation.md from the committed CSVs
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATASET="${1:?usage: scripts/confirmation.sh <dataset> (a conf/confirm/<dataset>.toml) [runner args]}"
shift
PRESET="conf/confirm/$DATASET.toml"
[ -f "$ROOT/$PRESET" ] || { echo "[confirmation] no $PRESET: pick one of $(cd "$ROOT/conf/confirm" && ls *.toml | sed 's/.toml//' | tr '\n' ' ')" >&2; exit 2; }
VENV="$(bash "$ROOT/scripts/setup-venv.sh")"
PROTOCOL="$(git -C "$ROOT" log -1 --format=%H -- docs/confirmation/PROTOCOL.md)"
TREE="${FEDOWEN_WORKTREE:-$ROOT/../confirm}"
RESULTS="$(mkdir -p "${FEDOWEN_RESULTS:-$ROOT/../runs/confirm-$DATASET}" && cd "${FEDOWEN_RESULTS:-$ROOT/../runs/confirm-$DATASET}" && pwd)"
if [ ! -d "$TREE" ]; then
  git -C "$ROOT" worktree add --detach "$TREE" "$PROTOCOL"
fi
[ "$(git -C "$TREE" rev-parse HEAD)" = "$PROTOCOL" ] || { echo "[confirmation] $TREE is not at the protocol commit ${PROTOCOL:0:7}: move it or set FEDOWEN_WORKTREE" >&2; exit 2; }
REPORT="$ROOT/docs/results/confirm-$DATASET"
RESTORE=()
if [ -d "$ROOT/archives/confirm-$DATASET" ]; then
  RESTORE=(--restore "$ROOT/archives/confirm-$DATASET")
elif [ -f "$REPORT/cells.tar.gz" ]; then  # a report written before issue 44
  RESTORE=(--restore "$REPORT/cells.tar.gz")
fi
[ -d "$REPORT" ] && RESTORE+=(--carry "$REPORT")
export PYTHONPATH="$ROOT" FLWR_TELEMETRY_ENABLED=0
if [ ${#RESTORE[@]} -gt 0 ]; then
  "$VENV/bin/python" -m sim.experiments run "$ROOT/$PRESET" --results "$RESULTS" "${RESTORE[@]}" --limit 0 >/dev/null
fi
cd "$TREE"
TREE_VENV="$(bash "$TREE/scripts/setup-venv.sh")"  # the protocol commit's lock
export PYTHONPATH="$TREE" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
exec "$TREE_VENV/bin/python" -m sim.experiments run "$PRESET" --results "$RESULTS" \
  --jobs "${JOBS:-1}" "$@"
