#!/usr/bin/env bash
# Is a GPU cell bit-reproducible with deterministic kernels? Two runs of one 8-round cell with
# and two without, in parallel; compare their rounds.jsonl (phi, weights, accuracies).
set -u
mkdir -p /tmp/site && xz -dc .device/site.tar.xz | tar -C /tmp/site -xf -
mkdir -p /tmp/data/MNIST/raw
(cd .device/data && find MNIST -name '*.xz') | while read -r rel; do t="/tmp/data/${rel%.xz}"; mkdir -p "$(dirname "$t")"; xz -dc ".device/data/$rel" > "$t"; done
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 FLWR_TELEMETRY_ENABLED=0
run() { # name det
  python3 - "$1" <<'PY'
import json, sys
c = json.load(open(".device/det-cell.json")); c["output-dir"] = f"/tmp/det/{sys.argv[1]}"
json.dump(c, open(f"/tmp/det-{sys.argv[1]}.json", "w"))
PY
  FEDOWEN_DET=$2 CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH="$PWD/.device/detsite:$PYTHONPATH" \
    timeout 150 python3 -m sim.inline --run-config /tmp/det-$1.json --num-supernodes 100 > "$OUT/$1.log" 2>&1
}
run plain-a 0 & run plain-b 0 & run det-a 1 & run det-b 1 & wait
python3 - <<'PY' | tee "$OUT/probe.txt"
import json
def rows(n):
    try: return [json.loads(l) for l in open(f"/tmp/det/{n}/rounds.jsonl")]
    except OSError as e: return str(e)
for a, b in (("plain-a", "plain-b"), ("det-a", "det-b")):
    ra, rb = rows(a), rows(b)
    if isinstance(ra, str) or isinstance(rb, str): print(a, b, "missing", ra if isinstance(ra, str) else rb); continue
    keys = ("test_accuracy", "phi", "weights", "selected")
    same = all(x.get(k) == y.get(k) for x, y in zip(ra, rb) for k in keys)
    first = next(((x["round"], k) for x, y in zip(ra, rb) for k in keys if x.get(k) != y.get(k)), None)
    print(a, b, "rounds", len(ra), len(rb), "identical" if same and len(ra) == len(rb) else f"differ first at {first}",
          [r.get("test_accuracy") for r in ra][-2:], [r.get("test_accuracy") for r in rb][-2:])
PY
