#!/usr/bin/env bash
# One short real run per attack (issue 72, deliver 3): MNIST, 20 rounds, 100 clients, 10 a round,
# 100 examples a client, 2000 test images; seed 0; the app's defaults otherwise.
# Usage, from the repository root: bash docs/results/backdoor-attacks-smoke/run_all.sh OUT
set -u
OUT=${1:?usage: run_all.sh OUT (a directory for the six runs)}
mkdir -p "$OUT"
VENV=$(bash scripts/setup-venv.sh)
base='"dataset": "mnist", "num-server-rounds": 20, "client-max-samples": 100, "test-max-samples": 2000, "seed": 0'
declare -A ARMS=(
  [clean]='"adversary-fraction": 0.0'
  [backdoor-bars]='"adversary-fraction": 0.2, "adversary-kind": "backdoor", "adversary-trigger": "bars", "adversary-trigger-size": 4, "adversary-trigger-position": "top-left"'
  [dba]='"adversary-fraction": 0.2, "adversary-kind": "dba", "adversary-trigger": "bars", "adversary-trigger-size": 4, "adversary-trigger-position": "top-left"'
  [backdoor]='"adversary-fraction": 0.2, "adversary-kind": "backdoor"'
  [neurotoxin]='"adversary-fraction": 0.2, "adversary-kind": "neurotoxin"'
  [adaptive-backdoor]='"adversary-fraction": 0.2, "adversary-kind": "adaptive-backdoor"'
)
for arm in clean backdoor-bars dba backdoor neurotoxin adaptive-backdoor; do
  echo "{${base}, ${ARMS[$arm]}, \"output-dir\": \"$OUT/$arm\"}" > "$OUT/$arm.json"
  start=$(date +%s)
  PYTHONPATH=. FEDOWEN_DATA=/work/shared/data FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 \
    nice -n 5 timeout 900 "$VENV/bin/python" -m sim.inline --run-config "$OUT/$arm.json" \
    --num-supernodes 100 > "$OUT/$arm.log" 2>&1
  echo "$arm rc=$? $(( $(date +%s) - start ))s"
done
