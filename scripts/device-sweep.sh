#!/usr/bin/env bash
# Run a preset's cells on a lent accelerator machine (the `device` tool), inline backend.
#
# Here, once per session (fills the git-ignored .device/: the Python 3.12 packages flwr 1.42 and
# scikit-learn need, installed here and packed with xz, 16 MB; the raw files of the datasets in
# DEVICE_DATASETS (folders of the data directory: MNIST, FashionMNIST, femnist, medmnist,
# cifar10), default MNIST, 9 MB; FashionMNIST 26 MB more, cifar10 19 MB; the finished cells of
# earlier device calls):
#   DEVICE_DATASETS="MNIST FashionMNIST" bash scripts/device-sweep.sh prepare [CELLS_ARCHIVE]
# A call sends the checkout's tracked files and .device, 64 MiB at most: before the calls,
# `hide` takes docs/results and archives/ out of the index (and ignores them; the files stay;
# about 3 MB is left), and `unhide` puts them back (commit nothing in between):
#   bash scripts/device-sweep.sh hide      ...calls...      bash scripts/device-sweep.sh unhide
# There, in each call (carry [".device"]; at most 10 minutes a call, so stop a minute early;
# 60 backdoor cells of 100 MNIST/FashionMNIST rounds took 5.4 min at --jobs 48 on an H100):
#   (but selection-dev's 100-client cells at --jobs 64 took 5-7 min each and finish together:
#   a runner cut at 6.3 min kept 24 of 64; give one runner the whole call, ~48 cells at once,
#   whole settings: --grid mnist --where alpha=0.01 is 45 cells)
#   bash scripts/device-sweep.sh run conf/ablation-mnist.toml 8 --grid ablation --jobs 30
# Back here: the call's files hold cells.tar.gz (every finished cell of this and earlier calls)
# and sweep.log; keep the archive as .device/cells.tar.gz for the next call and report with
#   python -m sim.experiments run PRESET --results results/PRESET-gpu --restore cells.tar.gz --limit 0
#   python -m sim.experiments report PRESET --results results/PRESET-gpu --out docs/results/PRESET-gpu
# A call that the deadline cuts leaves its unfinished cells' per-round checkpoints in /tmp/results
# there: a next call on the still-warm machine (within its 30 s) resumes them.
# Device cells differ from CPU cells in float rounding, so they are their own report, never
# mixed into a CPU sweep's pairs; nor are GPU cells bit-reproducible from call to call (one
# backdoor cell gave 5.6% and 9.3% attack success), so pair arms within one call.
# (Within one call they were: a probe in session 20 ran one 8-round MNIST FedOwen cell four
# times at once on an H100, twice with cuDNN's deterministic kernels and twice without; all
# four recorded identical rounds, phi and weights. Where the cross-call difference comes from,
# another machine or 48-way contention, is not known; docs/results/gpu-probe.) GPU-NOTES
# (../shared) has the measured throughput.
# flwr 1.42 imports httpx (and idna) at import time, which the device lacks: their wheels travel
# too (found by running a cell here with only the device's packages importable).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="$ROOT/.device"
WHEELS="flwr==1.42.0 cffi==2.1.1 click==8.5.1 cryptography==50.0.2 grpcio==1.85.1
grpcio-health-checking==1.81.1 iterators==0.0.2 protobuf==6.33.6 pycparser==3.12
pycryptodome==3.24.1 tomli==2.5.0 tomli-w==1.2.0 typer==0.20.1 httpx==0.28.1 idna==3.20
scikit-learn==1.9.1 joblib==1.6.0 threadpoolctl==3.8.0"

prepare() {
    local archive="${1:-}" data py name
    py="$(bash "$ROOT/scripts/setup-venv.sh")/bin/python"
    rm -rf "$DEV/site" "$DEV/whl" "$DEV/data"
    mkdir -p "$DEV/site"
    # installed for Python 3.12 here (no build runs: binary wheels only), tests dropped, packed
    # with xz: about half the size of the wheels themselves
    # shellcheck disable=SC2086
    "$py" -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any --target "$DEV/site" $WHEELS
    find "$DEV/site" -type d \( -name tests -o -name __pycache__ \) -prune -exec rm -rf {} +
    tar -C "$DEV/site" -cf - . | xz -9 -T2 > "$DEV/site.tar.xz"
    rm -rf "$DEV/site"
    data="$(cd "$ROOT" && "$py" -c 'from fedowen_task.data import resolve_data_dir; print(resolve_data_dir(None))')"
    # each dataset folder's files as the data directory lays them out, xz: MNIST 9 MB,
    # FashionMNIST 26 MB, femnist 6 MB, medmnist under 1 MB, cifar10 19 MB (its zip stores 60,000
    # small JPEGs whose headers repeat: 63 MB packs to 19 MB)
    for name in ${DEVICE_DATASETS:-MNIST}; do
        [ -d "$data/$name" ] || { echo "[device-sweep] no $data/$name" >&2; exit 2; }
        (cd "$data" && find "$name" -type f ! -name '*.gz') | while read -r rel; do
            mkdir -p "$DEV/data/$(dirname "$rel")"
            xz -9 -T2 -c "$data/$rel" > "$DEV/data/$rel.xz"
        done
    done
    if [ -n "$archive" ]; then cp "$archive" "$DEV/cells.tar.gz"; fi
    du -sh "$DEV"
}

run() {
    local preset="$1" minutes="$2"; shift 2
    : "${OUT:?run this on the device machine (OUT is its output folder)}"
    # a warm machine keeps /tmp from the call before
    if [ ! -f /tmp/site/.ready ]; then
        mkdir -p /tmp/site && xz -dc "$DEV/site.tar.xz" | tar -C /tmp/site -xf - && touch /tmp/site/.ready
    fi
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c 'import flwr, sklearn, scipy, numpy, torch; print("[device-sweep] flwr", flwr.__version__,
        "sklearn", sklearn.__version__, "scipy", scipy.__version__, "numpy", numpy.__version__,
        "torch", torch.__version__, "cuda", torch.cuda.is_available())'
    mkdir -p /tmp/results
    (cd "$DEV/data" && find . -type f -name '*.xz') | while read -r rel; do
        target="/tmp/data/${rel%.xz}"
        mkdir -p "$(dirname "$target")"
        [ -f "$target" ] || xz -dc "$DEV/data/$rel" > "$target"
    done
    local restore=()
    if [ -f "$DEV/cells.tar.gz" ]; then restore=(--restore "$DEV/cells.tar.gz"); fi
    cd "$ROOT"
    export PYTHONPATH="$ROOT:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
    # decode the preset's datasets once, before its cells start: 48 cells decoding CIFAR-10's
    # JPEGs at once would each take 17 s of a core and 0.75 GB (the decoded cache is shared)
    python3 - "$preset" <<'EOF'
import sys
from pathlib import Path
from fedowen_task.data import load_dataset
from sim.presets import load_preset
for name in sorted({cell.config.dataset for cell in load_preset(Path(sys.argv[1])).cells()}):
    load_dataset(name, "/tmp/data")
    print(f"[device-sweep] {name} decoded")
EOF
    # SIGTERM at the deadline: the runner stops its cells; finished ones are kept
    timeout --signal=TERM --kill-after=30 "${minutes}m" python3 -m sim.experiments run "$preset" \
        --backend inline --results /tmp/results --data-dir /tmp/data "${restore[@]}" "$@" \
        > "$OUT/sweep.log" 2>&1 || echo "[device-sweep] runner ended with $?" >> "$OUT/sweep.log"
    python3 - "$preset" <<'EOF'
import os, sys
from pathlib import Path
from sim.experiments import archive_cells
from sim.presets import load_preset
preset = load_preset(Path(sys.argv[1]))
path = archive_cells(preset, Path("/tmp/results"), Path(os.environ["OUT"]) / "cells.tar.gz")
done = sum((Path("/tmp/results") / c.cell_id / "summary.json").exists() for c in preset.cells())
print(f"[device-sweep] {done} of {len(preset.cells())} cells finished; archive {path}")
EOF
    tail -c 2000 "$OUT/sweep.log"
}

hide() {
    git -C "$ROOT" diff --cached --quiet || { echo "[device-sweep] the index has staged changes: commit them first" >&2; exit 2; }
    local path
    for path in docs/results archives; do
        git -C "$ROOT" rm -r -q --cached "$path"
        grep -qx "/$path/" "$ROOT/.git/info/exclude" 2>/dev/null || echo "/$path/" >> "$ROOT/.git/info/exclude"
    done
}

unhide() {
    git -C "$ROOT" reset -q -- docs/results archives
    sed -i -e '\#^/docs/results/$#d' -e '\#^/archives/$#d' "$ROOT/.git/info/exclude"
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    hide) hide ;;
    unhide) unhide ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare [CELLS_ARCHIVE] | hide | unhide | run PRESET MINUTES [sim.experiments run args]" >&2
       exit 2 ;;
esac
