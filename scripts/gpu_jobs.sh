#!/usr/bin/env bash
# Several jobs side by side on a machine with several GPUs (the device tool's nvidia-h100-x2/-x4,
# nvidia-h200-x2/-x4), so one 10-minute run does the work of as many GPUs: job i sees GPU i alone and
# the i-th equal share of the CPU cores (so one job's compiler threads do not slow another's timed steps).
#
#   scripts/gpu_jobs.sh NAME_1 "COMMAND 1" [NAME_2 "COMMAND 2" ...]
#
# Each job's output goes to $OUT/NAME.log; the exit code is the first failing job's. There must be at least
# as many GPUs as jobs.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/ostinato-jobs}"; mkdir -p "$OUT"     # the jobs write under it too
[ "$#" -ge 2 ] && [ $(($# % 2)) -eq 0 ] || { echo "usage: $0 NAME_1 'COMMAND 1' [NAME_2 'COMMAND 2' ...]" >&2; exit 2; }
jobs=$(($# / 2))
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge "$jobs" ] || { echo "gpu_jobs: $jobs jobs need $jobs GPUs, nvidia-smi lists $gpus" >&2; exit 2; }
# the CPUs this process may use (a cpuset need not start at 0 nor be contiguous)
read -r -a cpus <<<"$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
n=${#cpus[@]}; share=$((n / jobs))
[ "$share" -ge 1 ] || { echo "gpu_jobs: $jobs jobs on $n CPU cores" >&2; exit 2; }
job() {  # GPU, CPU list, name, command
  CUDA_VISIBLE_DEVICES=$1 TORCHINDUCTOR_COMPILE_THREADS=$share OMP_NUM_THREADS=$share \
    taskset -c "$2" bash -c "$4" >"$OUT/$3.log" 2>&1
  local rc=$?; echo "gpu_jobs: $3 (GPU $1, CPUs $2) exited $rc"; return $rc
}
pids=()
for ((i = 0; i < jobs; i++)); do
  name="$1"; cmd="$2"; shift 2
  list=$(IFS=,; echo "${cpus[*]:$((i * share)):$share}")
  job "$i" "$list" "$name" "$cmd" & pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p"; r=$?; [ "$rc" -eq 0 ] && rc=$r; done
exit $rc
