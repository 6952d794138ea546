#!/usr/bin/env bash
# Two jobs side by side on a machine with two GPUs (the device tool's nvidia-h200-x2), so one
# 10-minute run does two GPUs' work: job A sees GPU 0 and the first half of the CPU cores, job B
# GPU 1 and the second half (so one job's compiler threads do not slow the other's timed steps).
#
#   scripts/gpu_pair.sh NAME_A "COMMAND A" NAME_B "COMMAND B"
#
# Each job's output goes to $OUT/NAME.log; the exit code is the first failing job's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/ostinato-pair}"; mkdir -p "$OUT"
[ "$#" -eq 4 ] || { echo "usage: $0 NAME_A 'COMMAND A' NAME_B 'COMMAND B'" >&2; exit 2; }
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 2 ] || { echo "gpu_pair: needs two GPUs, nvidia-smi lists $gpus" >&2; exit 2; }
n=$(nproc); half=$((n / 2))
job() {  # GPU, CPU list, name, command
  CUDA_VISIBLE_DEVICES=$1 TORCHINDUCTOR_COMPILE_THREADS=$half OMP_NUM_THREADS=$half \
    taskset -c "$2" bash -c "$4" >"$OUT/$3.log" 2>&1
  local rc=$?; echo "gpu_pair: $3 (GPU $1, CPUs $2) exited $rc"; return $rc
}
job 0 "0-$((half - 1))" "$1" "$2" & a=$!
job 1 "$half-$((n - 1))" "$3" "$4" & b=$!
wait $a; ra=$?; wait $b; rb=$?
[ $ra -ne 0 ] && exit $ra; exit $rb
