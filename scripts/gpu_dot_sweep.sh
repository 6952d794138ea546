#!/usr/bin/env bash
# Issue #15's batch-32 decode: the tl.dot matmul groups (OSTINATO_DOT_ROWS=64, 5 launches a layer) against
# cuBLAS (8), in GPU time per step for each setting of their knobs (bench/profile_kernels.py), then the step
# time of the fastest setting against reduce-overhead (bench/run_suite.py). Run on a GPU machine:
#
#   OUT=DIR [CONFIG=llama-4096-decode-b32] bash scripts/gpu_dot_sweep.sh
#
# Writes DIR/dot_sweep.json (the profiles), DIR/dot_best_suite.json and DIR/cublas_suite.json (step times).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?OUT=DIR}"; CONFIG="${CONFIG:-llama-4096-decode-b32}"; mkdir -p "$OUT"
D=OSTINATO_DOT_ROWS=64
B="$D+OSTINATO_DOT_STATS_STAGES=4+OSTINATO_DOT_STAGES=4+OSTINATO_DOT_RBLOCK=128+OSTINATO_DOT_WARPS=8"
V="cublas,dot:$D,best1127:$B"
V="$V,split2:$B+OSTINATO_DOT_SPLIT=2"
V="$V,split4:$B+OSTINATO_DOT_SPLIT=4"
V="$V,split8:$B+OSTINATO_DOT_SPLIT=8"
V="$V,split4_n32:$B+OSTINATO_DOT_SPLIT=4+OSTINATO_DOT_NBLOCK=32"
V="$V,split2_r256:$B+OSTINATO_DOT_SPLIT=2+OSTINATO_DOT_RBLOCK=256+OSTINATO_DOT_STAGES=3"
V="$V,split4_w4:$D+OSTINATO_DOT_STATS_STAGES=4+OSTINATO_DOT_STAGES=4+OSTINATO_DOT_RBLOCK=128+OSTINATO_DOT_SPLIT=4"
V="$V,split4_s5:$B+OSTINATO_DOT_SPLIT=4+OSTINATO_DOT_STAGES=5"
python3 bench/profile_kernels.py --configs "$CONFIG" --no-inductor --variants "$V" --out "$OUT/dot_sweep.json"
# the fastest dot setting's environment, as VAR=VALUE words
BEST=$(python3 - "$OUT/dot_sweep.json" "$V" <<'PY'
import json, sys
rec = next(iter(json.load(open(sys.argv[1])).values()))
envs = {n: e for n, _, e in (item.partition(":") for item in sys.argv[2].split(","))}
best = min((r["total_ms"], k[len("ostinato_"):]) for k, r in rec.items() if k != "ostinato_cublas" and "total_ms" in r)[1]
print(best, envs[best].replace("+", " "))
PY
)
echo "fastest tl.dot setting: $BEST"
read -r NAME ENVS <<<"$BEST"
env $ENVS python3 bench/run_suite.py --device cuda --configs "$CONFIG" --runners eager,torch_compile_ro,ostinato_replay \
  --no-startup --out "$OUT/dot_best" >"$OUT/dot_best_suite.log" 2>&1 && cp "$OUT/dot_best/results.json" "$OUT/dot_best_suite.json" \
  || echo "dot suite run failed"
python3 bench/run_suite.py --device cuda --configs "$CONFIG" --runners ostinato_replay \
  --no-startup --out "$OUT/cublas" >"$OUT/cublas_suite.log" 2>&1 && cp "$OUT/cublas/results.json" "$OUT/cublas_suite.json" \
  || echo "cublas suite run failed"
