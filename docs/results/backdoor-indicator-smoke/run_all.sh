#!/usr/bin/env bash
# One short real run of BackdoorIndicator (issue 72, deliver 2), beside the defaults: MNIST, 10
# rounds, 50 clients, 100 examples a client, 1000 test images, seed 0, 20% backdoor attackers
# (the app's square trigger), as docs/results/backdoor-peers-smoke; the indicator added after
# the update filter, at the public code's defaults (200 epochs at lr 0.005, mu 0.4, threshold
# 0.95) but 192 Fashion-MNIST samples (three batches of 64, not its 800 -> 768): a quarter of
# the planting's CPU time (about 60 s a round at 768 on this shared 2-core VM).
# Usage, from the repository root: bash docs/results/backdoor-indicator-smoke/run_all.sh OUT
set -u
OUT=${1:?usage: run_all.sh OUT (a directory for the runs)}
mkdir -p "$OUT"
VENV=$(bash scripts/setup-venv.sh)
base='"dataset": "mnist", "num-server-rounds": 10, "client-max-samples": 100, "test-max-samples": 1000, "seed": 0, "adversary-fraction": 0.2, "adversary-kind": "backdoor"'
head='identity norm-ratio update-bound update-filter'
tail='norm-cap statistics-cap value-cap links statistics-rule robust-lr aggregate-noise'
declare -A ARMS=(
  [defaults]='"defences": "auto"'
  [indicator]="\"defences\": \"$head indicator $tail\", \"indicator-samples\": 192"
)
for arm in defaults indicator; do
  echo "{${base}, ${ARMS[$arm]}, \"output-dir\": \"$OUT/$arm\"}" > "$OUT/$arm.json"
  start=$(date +%s)
  PYTHONPATH=. FEDOWEN_DATA=/work/shared/data FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 \
    nice -n 5 timeout 900 "$VENV/bin/python" -m sim.inline --run-config "$OUT/$arm.json" \
    --num-supernodes 50 > "$OUT/$arm.log" 2>&1
  echo "$arm rc=$? $(( $(date +%s) - start ))s"
done
