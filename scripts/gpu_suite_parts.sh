#!/usr/bin/env bash
# Several parts of the full CUDA matrix at once, one per GPU of a multi-GPU machine (the device tool's
# nvidia-h200-x4 and kin), through scripts/gpu_jobs.sh: a four-GPU call runs four parts in one call's time.
#
#   scripts/gpu_suite_parts.sh N K1 [K2 ...]      parts K1, K2, ... of N, e.g. 36 4 5 6 7
#   scripts/gpu_suite_parts.sh N 16+17 18+19       parts 16 and 17 one after the other on the first GPU, ...
#
# Each part's results land in $OUT/part-KofN/ and its log in $OUT/partK.log (parts run one after the other
# share one log, $OUT/partK1+K2.log). SUITE_TIMEOUT (default 545 s) is the whole of one GPU's time: each
# part runs until that deadline, so a part stopped early keeps what it measured (see gpu_suite.sh) and a
# later one of its group may get little time.
set -uo pipefail
cd "$(dirname "$0")/.."
[ "$#" -ge 2 ] || { echo "usage: $0 N K1 [K2 ...]" >&2; exit 2; }
n="$1"; shift
jobs=()
for group in "$@"; do
  IFS=+ read -r -a parts <<<"$group"
  # every part runs, each until the group's deadline; the job's exit code is the first failing part's
  cmd="rc=0; end=\$((SECONDS + ${SUITE_TIMEOUT:-545}))"
  for k in "${parts[@]}"; do
    [[ "$k" =~ ^[0-9]+$ ]] || { echo "gpu_suite_parts: '$group' is not K or K1+K2" >&2; exit 2; }
    # a part with no time left is not started (timeout 0 would mean no limit), and counts as timed out
    cmd+='; left=$((end - SECONDS)); if [ "$left" -gt 0 ]; then SUITE_TIMEOUT=$left bash scripts/gpu_suite.sh '"$k/$n"
    cmd+=' --startup-configs representative; else echo "part '"$k"' not started: the deadline passed"; false; fi'
    cmd+=' || { r=$?; [ "$r" -eq 1 ] && [ "$left" -le 0 ] && r=124; [ "$rc" -eq 0 ] && rc=$r; }'
  done
  jobs+=("part$group" "$cmd; exit \$rc")
done
exec bash scripts/gpu_jobs.sh "${jobs[@]}"
