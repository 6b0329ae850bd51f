#!/usr/bin/env bash
# Run (or go on with) the confirmation's cells of one dataset on a fresh machine, as the protocol
# says: from a clean worktree of the protocol commit, on top of what the committed report holds.
#   scripts/confirmation.sh fashion-mnist          # one cell at a time
#   JOBS=2 scripts/confirmation.sh cifar10         # two at once (one core each)
#   scripts/confirmation.sh mnist --limit 0        # set up and count, run nothing (more
#                                                  # arguments go to the runner)
#   STUDY=second scripts/confirmation.sh mnist     # the second confirmation (conf/confirm2/,
#                                                  # docs/confirmation2/; refused until in force)
# Steps: (1) the worktree ($FEDOWEN_WORKTREE, default ../confirm) at the protocol commit, made
# when missing; (2) the results dir ($FEDOWEN_RESULTS, default ../runs/confirm-<dataset>) gets the
# committed tuning cells (archives/confirm-<dataset>/, when git has them) and every finished cell of
# the committed per-round CSVs, with its config and code records (`run --carry`, from this
# checkout: the protocol commit predates it); (3) the protocol commit's runner runs the rest.
# Kill it at any time; the same command goes on. Then, from this checkout:
#   scripts/experiment.sh report conf/confirm/<dataset>.toml --results <results> --archive
#   python -m studies.confirmation.pages check conf/confirm/<dataset>.toml --results <results>
#   python -m studies.confirmation.pages check conf/confirm/<dataset>.toml --committed   # what git holds
#   python -m studies.confirmation.pages report          # docs/confirmation.md from the committed CSVs
# (with --study second for the second confirmation's check and report)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${STUDY:-first}" in
  first) CONF=conf/confirm; DOCS=docs/confirmation; NAME=confirm ;;
  second) CONF=conf/confirm2; DOCS=docs/confirmation2; NAME=confirm2 ;;
  *) echo "[confirmation] STUDY=$STUDY: give first or second" >&2; exit 2 ;;
esac
DATASET="${1:?usage: [STUDY=second] scripts/confirmation.sh <dataset> (a $CONF/<dataset>.toml) [runner args]}"
shift
PRESET="$CONF/$DATASET.toml"
[ -f "$ROOT/$PRESET" ] || { echo "[confirmation] no $PRESET: pick one of $(cd "$ROOT/$CONF" && ls *.toml | sed 's/.toml//' | tr '\n' ' ')" >&2; exit 2; }
if ! grep -q '^\*\*In force\*\*' "$ROOT/$DOCS/PROTOCOL.md"; then
  echo "[confirmation] $DOCS/PROTOCOL.md is not in force yet: no confirmation cell runs before it (its tuning runs with python -m sim.experiments run $PRESET)" >&2
  exit 2
fi
VENV="$(bash "$ROOT/scripts/setup-venv.sh")"
PROTOCOL="$(git -C "$ROOT" log -1 --format=%H -- "$DOCS/PROTOCOL.md")"
TREE="${FEDOWEN_WORKTREE:-$ROOT/../$NAME}"
RESULTS="$(mkdir -p "${FEDOWEN_RESULTS:-$ROOT/../runs/$NAME-$DATASET}" && cd "${FEDOWEN_RESULTS:-$ROOT/../runs/$NAME-$DATASET}" && pwd)"
if [ ! -d "$TREE" ]; then
  git -C "$ROOT" worktree add --detach "$TREE" "$PROTOCOL"
fi
[ "$(git -C "$TREE" rev-parse HEAD)" = "$PROTOCOL" ] || { echo "[confirmation] $TREE is not at the protocol commit ${PROTOCOL:0:7}: move it or set FEDOWEN_WORKTREE" >&2; exit 2; }
REPORT="$ROOT/docs/results/$NAME-$DATASET"
RESTORE=()
if [ -d "$ROOT/archives/$NAME-$DATASET" ]; then
  RESTORE=(--restore "$ROOT/archives/$NAME-$DATASET")
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
