#!/usr/bin/env bash
# The benchmark suite on the lent GPU machine, from the repository root, results under $OUT.
#
#   scripts/gpu_suite.sh              the quick subset (under 8 minutes on one H100)
#   scripts/gpu_suite.sh 3/13         part 3 of 13 of the full CUDA matrix (each part ~9 minutes or less)
#   scripts/gpu_suite.sh list         the CUDA configurations, their estimates and the parts they need
#
# Merge the parts afterwards (on any machine):
#   python3 bench/run_suite.py --merge part-*/results.json --out docs/benchmarks/suite_gpu
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/ostinato-bench}"
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
case "${1:-quick}" in
  quick)
    "$PY" bench/run_suite.py --device cuda --quick --workdir "$OUT/work" --out "$OUT/quick" ;;
  list)
    "$PY" bench/run_suite.py --device cuda --list ;;
  */*)
    part="$1"; tag="part-${part%/*}of${part#*/}"
    "$PY" bench/run_suite.py --device cuda --part "$part" --workdir "$OUT/work" --out "$OUT/$tag" ;;
  *)
    echo "usage: $0 [quick | list | K/N]" >&2; exit 2 ;;
esac
# The fresh processes' .ost files and caches are large: keep only the results.
rm -rf "$OUT/work"
