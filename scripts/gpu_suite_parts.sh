#!/usr/bin/env bash
# Several parts of the full CUDA matrix at once, one per GPU of a multi-GPU machine (the device tool's
# nvidia-h200-x4 and kin), through scripts/gpu_jobs.sh: a four-GPU call runs four parts in one call's time.
#
#   scripts/gpu_suite_parts.sh N K1 [K2 ...]      parts K1, K2, ... of N, e.g. 36 4 5 6 7
#
# Each part's results land in $OUT/part-KofN/ and its log in $OUT/partK.log; SUITE_TIMEOUT (default 545 s)
# stops a part before the device tool's 10-minute limit (what it measured by then is kept, see gpu_suite.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
[ "$#" -ge 2 ] || { echo "usage: $0 N K1 [K2 ...]" >&2; exit 2; }
n="$1"; shift
jobs=()
for k in "$@"; do
  jobs+=("part$k" "SUITE_TIMEOUT=${SUITE_TIMEOUT:-545} bash scripts/gpu_suite.sh $k/$n --startup-configs representative")
done
exec bash scripts/gpu_jobs.sh "${jobs[@]}"
