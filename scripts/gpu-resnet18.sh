#!/usr/bin/env bash
# ResNet-18 on CIFAR-10 on a lent GPU machine (issue 59, point 5): seconds a round alone and with
# 4 and 8 runs at once, the valuation's share, and a 30-round smoke run of FedOwen and
# equal-weight FedAvg on seed 0; clients and server on the GPU (benchmarks/gpu_resnet18.py has
# the phases; docs/results/gpu-resnet18/README.md what to do before and after).
#
# Here, once (fills the git-ignored .device/: flwr and friends for Python 3.12, CIFAR-10):
#   DEVICE_DATASETS="cifar10" bash scripts/device-sweep.sh prepare
#   bash scripts/device-sweep.sh hide        # docs/results and archives/ stay here
# The device call (run in the repo root, carry [".device"], timeout_s 600): ends in ~8 minutes
#   bash scripts/gpu-resnet18.sh
# Back here: bash scripts/device-sweep.sh unhide, then the README's "After the call".
#
# On the CPU here, the same script end to end on MNIST LeNet, 2 rounds, tiny caps (.device
# prepared with DEVICE_DATASETS="MNIST cifar10"; the packed site is unpacked but not imported:
# it is for Python 3.12, the venv is 3.11):
#   SMOKE=1 OUT=/tmp/gpuout bash scripts/gpu-resnet18.sh
#
# Every phase has its own time limit, the whole script BUDGET_S seconds (default 480); what was
# measured is summarised in $OUT after every phase and again at the end, also when cut:
# gpu-resnet18.log, summary.json, concurrency.csv, smoke-rounds.csv.gz, smoke-accuracy.png,
# records.tar.gz (every run's rounds.jsonl, logs and configs; no models).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="$ROOT/.device"
START=$(date +%s)
BUDGET_S="${BUDGET_S:-480}"
: "${OUT:?OUT must name the folder that comes back (the device sets it)}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-resnet18.log") 2>&1

if [ "${SMOKE:-0}" = 1 ]; then
    PROFILE=smoke; BASE=/tmp/gpu-resnet18-smoke; DATASET=mnist
    PY="$(bash "$ROOT/scripts/setup-venv.sh")/bin/python"; SITE_ON_PATH=0
else
    PROFILE="${GPU_PROFILE:-gpu}"; BASE=/tmp; DATASET=cifar10; PY=python3; SITE_ON_PATH=1
fi
SITE="$BASE/site"; DATA="$BASE/data"; WORK="${WORK:-$BASE/gpu-resnet18}"
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
say() { echo "[gpu-resnet18 $(( $(date +%s) - START ))s] $*"; }

finish() {  # on every exit: the summary and the records tarball from whatever ran
    local rc=$?
    if [ -d "$WORK/runs" ]; then
        timeout 60 "$PY" -m benchmarks.gpu_resnet18_summary --runs "$WORK/runs" --out "$OUT" \
            --pack "$OUT/records.tar.gz" || say "summary failed ($?)"
    fi
    say "exit $rc; files: $(cd "$OUT" && ls | tr '\n' ' ')"
}
trap finish EXIT

say "profile $PROFILE, budget ${BUDGET_S}s, work $WORK"
# a warm machine keeps /tmp from the call before (scripts/device-sweep.sh's layout)
if [ ! -f "$SITE/.ready" ]; then
    [ -f "$DEV/site.tar.xz" ] || { say "no $DEV/site.tar.xz: run scripts/device-sweep.sh prepare here and carry .device"; exit 2; }
    mkdir -p "$SITE"
    timeout 120 bash -c "xz -dc '$DEV/site.tar.xz' | tar -C '$SITE' -xf -"
    touch "$SITE/.ready"
fi
say "site unpacked: $(du -sh "$SITE" | cut -f1)"
[ -d "$DEV/data/$([ "$DATASET" = mnist ] && echo MNIST || echo cifar10)" ] \
    || { say "no $DATASET in $DEV/data: prepare with DEVICE_DATASETS naming it"; exit 2; }
(cd "$DEV/data" && find . -type f -name '*.xz') | while read -r rel; do
    target="$DATA/${rel%.xz}"
    mkdir -p "$(dirname "$target")"
    [ -f "$target" ] || timeout 120 xz -dc "$DEV/data/$rel" > "$target"
done
say "data in $DATA: $(du -sh "$DATA" | cut -f1)"

cd "$ROOT"
if [ "$SITE_ON_PATH" = 1 ]; then export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"; fi
export PYTHONUNBUFFERED=1
timeout 60 "$PY" -c 'import flwr, numpy, torch; print("[gpu-resnet18] flwr", flwr.__version__,
    "numpy", numpy.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available(),
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
if [ "$PROFILE" != smoke ]; then
    "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' \
        || { say "torch sees no CUDA device: nothing to measure"; exit 3; }
    nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv || true
fi
# decode once before any run starts (CIFAR-10's JPEGs: ~17 s of a core; the cache is shared)
timeout 150 "$PY" -c "from fedowen_task.data import load_dataset; load_dataset('$DATASET', '$DATA')"
say "$DATASET decoded; $(left)s left for the phases"

# the driver stops its phases by its deadline; the timeout is a backstop (SIGTERM: it stops its
# runs and summarises; SIGKILL 20 s later)
[ "$(left)" -ge 90 ] || { say "only $(left)s left after the setup: no phase runs"; exit 4; }
rc=0
timeout --signal=TERM --kill-after=20 "$(( $(left) - 10 ))" "$PY" -m benchmarks.gpu_resnet18 \
    --profile "$PROFILE" --data-dir "$DATA" --work "$WORK" --out "$OUT" \
    --deadline-s "$(( $(left) - 25 ))" ${ALONE_ROUNDS:+--alone-rounds "$ALONE_ROUNDS"} || rc=$?
say "phases ended with $rc"
exit "$rc"
