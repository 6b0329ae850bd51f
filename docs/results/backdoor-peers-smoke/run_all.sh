#!/usr/bin/env bash
# One short real run per peer (issue 72, deliver 2): MNIST, 10 rounds, 50 clients, 100 examples
# a client, 1000 test images, seed 0, 20% backdoor attackers (the app's square trigger); the
# defaults' list (auto) and that list with each peer added after the update filter.
# Usage, from the repository root: bash docs/results/backdoor-peers-smoke/run_all.sh OUT [ARM...]
# (the arms: defaults alignins multi-metrics flame; all of them without ARM)
set -u
OUT=${1:?usage: run_all.sh OUT [ARM...] (a directory for the runs)}
shift
RUN=("$@")
[ ${#RUN[@]} -eq 0 ] && RUN=(defaults alignins multi-metrics flame)
mkdir -p "$OUT"
VENV=$(bash scripts/setup-venv.sh)
base='"dataset": "mnist", "num-server-rounds": 10, "client-max-samples": 100, "test-max-samples": 1000, "seed": 0, "adversary-fraction": 0.2, "adversary-kind": "backdoor"'
head='identity norm-ratio update-bound update-filter'
tail='norm-cap statistics-cap value-cap links statistics-rule robust-lr aggregate-noise'
declare -A ARMS=(
  [defaults]='"defences": "auto"'
  [alignins]="\"defences\": \"$head alignins $tail\""
  [multi-metrics]="\"defences\": \"$head multi-metrics $tail\""
  [flame]="\"defences\": \"$head flame $tail\""
)
for arm in "${RUN[@]}"; do
  echo "{${base}, ${ARMS[$arm]}, \"output-dir\": \"$OUT/$arm\"}" > "$OUT/$arm.json"
  start=$(date +%s)
  PYTHONPATH=. FEDOWEN_DATA=/work/shared/data FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 \
    nice -n 5 timeout 600 "$VENV/bin/python" -m sim.inline --run-config "$OUT/$arm.json" \
    --num-supernodes 50 > "$OUT/$arm.log" 2>&1
  echo "$arm rc=$? $(( $(date +%s) - start ))s"
done
