#!/usr/bin/env bash
# Issue #15's batch-32 decode under OSTINATO_DOT_PICK=prologue (codegen/linear.py: q/k/v with their norm and
# down with its SwiGLU as tl.dot matmul groups, 6 launches a layer) against the default (cuBLAS, 8). GPU time
# per step, kernel by kernel (bench/profile_kernels.py), then step times against eager and reduce-overhead
# (bench/run_suite.py). Run on a GPU machine:
#
#   OUT=DIR [CONFIG=gpu/llama-4096-decode-b32] bash scripts/gpu_dot_pick.sh
#
# Writes DIR/dot_pick_profile.json (the default; the pick with the launcher's knobs and with the 1127 sweep's
# fastest; every projection moved (5 launches); q/k/v and gate/up moved, the lone ones left (5)) and
# DIR/suite_default.json, DIR/suite_pick.json, DIR/suite_pick_best.json (step times).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?OUT=DIR}"; CONFIG="${CONFIG:-gpu/llama-4096-decode-b32}"; mkdir -p "$OUT"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
P=OSTINATO_DOT_ROWS=64+OSTINATO_DOT_PICK=prologue
B=OSTINATO_DOT_STATS_STAGES=4+OSTINATO_DOT_STAGES=4+OSTINATO_DOT_RBLOCK=128+OSTINATO_DOT_WARPS=8
V="default,pick:$P,pick_best:$P+$B,all_best:OSTINATO_DOT_ROWS=64+$B"
V="$V,nolone_best:OSTINATO_DOT_ROWS=64+OSTINATO_LONE_GEMV=0+$B"
python3 bench/profile_kernels.py --configs "$CONFIG" --no-inductor --variants "$V" --out "$OUT/dot_pick_profile.json" \
  || echo "profile failed"
for run in "default:" "pick:$P" "pick_best:$P+$B"; do
  name=${run%%:*}; envs=${run#*:}
  env ${envs//+/ } python3 bench/run_suite.py --device cuda --configs "$CONFIG" \
    --runners eager,torch_compile_ro,ostinato_replay --no-startup --out "$OUT/$name" >"$OUT/suite_$name.log" 2>&1 \
    && cp "$OUT/$name/results.json" "$OUT/suite_$name.json" || echo "suite run $name failed"
done
