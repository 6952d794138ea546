#!/usr/bin/env bash
# The whole CUDA matrix of bench/run_suite.py on ONE GPU, across the device tool's 10-minute calls: call
# the same command again on the still-warm machine and it goes on where the last call stopped.
#
#   OUT=$OUT bash scripts/gpu_matrix.sh            # each call: up to $BUDGET seconds (default 540)
#
# 1. Warm-up (the first call): the matrix in $WARM_PARTS parts side by side on the GPU, untimed (1 ms
#    trials), so torch.compile's caches (FX graph, AOTAutograd), Triton's and ostinato's hold every
#    configuration's compiled code. torch.compile's first calls are three quarters of the matrix's time
#    (1488 of 2170 s at c68dd9f); none of them is a figure of this matrix (start-up is measured in fresh
#    processes by `run_suite.py` without --no-startup, and by bench/startup.py).
# 2. Timed: the configurations one after another in one process that has the machine to itself: eager,
#    torch.compile(mode="reduce-overhead") and ostinato replay, outputs checked, trials interleaved, as
#    any run_suite.py run. Each call times those not yet timed until its budget runs out; a configuration
#    cut short is timed again by the next call.
#
# State (caches, results) lives in $STATE on the machine, so the calls must come while it is warm. Each
# call copies the results so far and its logs to $OUT; when every configuration is timed, it merges them
# into $OUT/matrix (results.json, results.md) and prints "matrix: complete".
set -uo pipefail
cd "$(dirname "$0")/.."
STATE=${STATE:-/tmp/ostinato-matrix}
OUT=${OUT:-$STATE/out}
BUDGET=${BUDGET:-540}
WARM_S=${WARM_S:-420}
WARM_PARTS=${WARM_PARTS:-6}
COSTS=${COSTS:-docs/benchmarks/fusion_matrix_gpu_1127_h200_c68dd9f/results.json}
PY=${PYTHON:-python3}
export TORCHINDUCTOR_CACHE_DIR=$STATE/inductor TRITON_CACHE_DIR=$STATE/triton OSTINATO_CACHE_DIR=$STATE/ostinato
export PYTHONUNBUFFERED=1
mkdir -p "$STATE/timed" "$OUT"
start=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - start))); }
SUITE="$PY bench/run_suite.py --device cuda --no-startup --runners eager,torch_compile_ro,ostinato_replay"

# the configurations not yet timed, in the suite's order, as exact names joined by commas
untimed() {
  $PY - "$STATE/timed" <<'EOF'
import glob, json, os, sys
sys.path.insert(0, os.getcwd())
from bench.suite import configs
done = set()
for f in glob.glob(os.path.join(sys.argv[1], "*", "results*.json")):
    done |= {c["config"]["name"] for c in json.load(open(f)).get("configs", [])}
print(",".join(c.name for c in configs.select("cuda") if c.name not in done))
EOF
}
todo=$(untimed)
if [ ! -e "$STATE/warm.done" ] && [ -n "$todo" ]; then
  read -r -a cpus <<<"$($PY -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
  share=$(( ${#cpus[@]} / WARM_PARTS )); [ "$share" -ge 1 ] || share=1
  echo "matrix: warm-up, $WARM_PARTS parts side by side, at most ${WARM_S} s"
  pids=()
  for ((k = 1; k <= WARM_PARTS; k++)); do
    list=$(IFS=,; echo "${cpus[*]:$(((k - 1) * share % ${#cpus[@]})):$share}")
    TORCHINDUCTOR_COMPILE_THREADS=$share OSTINATO_COMPILE_WORKERS=$share \
      taskset -c "$list" timeout --signal=INT "$WARM_S" $SUITE --configs "$todo" --part "$k/$WARM_PARTS" --costs "$COSTS" \
      --trial-seconds 0.001 --out "$STATE/warm$k" >"$STATE/warm$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  # a part the limit cut leaves some configurations cold: the timed run compiles them itself
  touch "$STATE/warm.done"
  echo "matrix: warm-up done after $(($(date +%s) - start)) s"
fi

todo=$(untimed)
if [ -n "$todo" ] && [ "$(left)" -gt 60 ]; then
  run=$(ls -d "$STATE"/timed/run*/ 2>/dev/null | wc -l)
  echo "matrix: timing $(echo "$todo" | tr ',' '\n' | wc -l) configurations for at most $(($(left) - 15)) s (run $run)"
  timeout --signal=INT $(($(left) - 15)) $SUITE --configs "$todo" --out "$STATE/timed/run$run" \
    2>&1 | tee "$STATE/timed/run$run.log" | grep -E "^\[|ms/step|WRONG|error"
fi

# what came back so far
for d in "$STATE"/timed/run*/; do
  r=$(basename "$d")
  for f in results.json results.partial.json; do [ -e "$d/$f" ] && cp "$d/$f" "$OUT/${r}_$f"; done
done
mkdir -p "$OUT/logs"; cp "$STATE"/*.log "$STATE"/timed/*.log "$OUT/logs/" 2>/dev/null
todo=$(untimed)
if [ -z "$todo" ]; then
  parts=()
  for d in "$STATE"/timed/run*/; do
    if [ -e "$d/results.json" ]; then parts+=("$d/results.json"); elif [ -e "$d/results.partial.json" ]; then parts+=("$d/results.partial.json"); fi
  done
  $PY bench/run_suite.py --merge "${parts[@]}" --out "$OUT/matrix" && echo "matrix: complete"
else
  echo "matrix: $(echo "$todo" | tr ',' '\n' | wc -l) configurations left; call again"
fi
