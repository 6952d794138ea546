#!/usr/bin/env bash
# The benchmark suite on the lent GPU machine, from the repository root, results under $OUT.
#
#   scripts/gpu_suite.sh              the quick subset (under 8 minutes on one H100; no AOTInductor)
#   scripts/gpu_suite.sh 3/36 [ARGS]  part 3 of 36 of the full CUDA matrix (ARGS go to bench/run_suite.py,
#                                     e.g. --startup-configs representative: one configuration per category)
#   scripts/gpu_suite.sh list [ARGS]  the CUDA configurations, their estimates and the parts they need
#
# The full matrix (64 configurations, every runner: eager, CUDA graph of eager, torch.compile default and
# reduce-overhead, ostinato with and without replay, AOTInductor with and without a CUDA graph) is about
# 36 parts with --startup-configs representative (`list --startup-configs representative` says). A
# configuration estimated above one part's budget gets a part of its own and may not fit 10 minutes:
# run its runners in two calls (e.g. `1/1 --configs NAME --runners aoti,aoti_cuda_graph --no-startup`
# and `1/1 --configs NAME --runners eager,cuda_graph_eager,torch_compile,torch_compile_ro,ostinato,ostinato_replay`);
# --merge joins their cells into one row.
#
# SUITE_TIMEOUT (seconds, default 570) stops a part before the device tool's 10-minute limit; what it
# measured by then is in $OUT/part-KofN/results.partial.json, which --merge takes like a full result.
# Merge the parts afterwards (on any machine):
#   python3 bench/run_suite.py --merge part-*/results.json --out docs/benchmarks/suite_gpu
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/ostinato-bench}"
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i "${CUDA_VISIBLE_DEVICES:-0}" || true
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
what="${1:-quick}"; shift || true
case "$what" in
  quick) tag="quick"; set -- --quick "$@" ;;
  list) exec "$PY" bench/run_suite.py --device cuda --list "$@" ;;
  */*) tag="part-${what%/*}of${what#*/}"; set -- --part "$what" "$@" ;;
  *) echo "usage: $0 [quick | list | K/N] [run_suite arguments]" >&2; exit 2 ;;
esac
# The fresh processes' .ost files and caches are large: they stay outside $OUT and are removed.
work="$(mktemp -d "/tmp/ostinato-suite-$tag-XXXX")"
timeout --signal=INT --kill-after=20 "${SUITE_TIMEOUT:-570}" \
  "$PY" bench/run_suite.py --device cuda --workdir "$work" --out "$OUT/$tag" "$@"
rc=$?
rm -rf "$work"
exit $rc
