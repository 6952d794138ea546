#!/usr/bin/env bash
# Generic fusion on the lent GPU (issue #15): the `cuda` tests of codegen (and, with TESTS=all, of the
# other GPU paths), then the suite's configurations matched by $CONFIGS with fusion on and off, under $OUT.
#   CONFIGS=user- scripts/gpu_fusion.sh          TESTS=none|codegen|all|'test paths' (default codegen)
#   PART=2/4 TESTS=none scripts/gpu_fusion.sh    part 2 of 4 of the whole CUDA matrix instead of $CONFIGS
#   RUNNERS=... overrides the runners (default: eager, CUDA graph of eager, reduce-overhead, replay on/off)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/ostinato-fusion}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
case "${TESTS:-codegen}" in
  none) ;;
  codegen) "$PY" -m pytest -q -m cuda -p no:cacheprovider -n 8 tests/codegen -rfEs 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
  all) "$PY" -m pytest -q -m cuda -p no:cacheprovider -n 8 tests/codegen tests/replay tests/backends tests/models \
         tests/ops/test_op_table.py tests/dynamo tests/passes -rfEs 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
  *) "$PY" -m pytest -q -m cuda -p no:cacheprovider -n 8 $TESTS -rfEs 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
esac
if [ -n "${CONFIGS:-}" ] || [ -n "${PART:-}" ]; then
  work="$(mktemp -d /tmp/ostinato-fusion-XXXX)"
  if [ -n "${PART:-}" ]; then select=(--part "$PART"); tag="part-${PART%/*}of${PART#*/}"; else select=(--configs "$CONFIGS"); tag=suite; fi
  timeout --signal=INT --kill-after=20 "${SUITE_TIMEOUT:-400}" "$PY" bench/run_suite.py --device cuda "${select[@]}" \
    --runners "${RUNNERS:-eager,cuda_graph_eager,torch_compile_ro,ostinato_replay,ostinato_replay_unfused}" \
    --no-startup --workdir "$work" --out "$OUT/$tag" 2>&1 | tail -40
  rm -rf "$work"
fi
if [ -n "${ALSO:-}" ]; then   # configurations to (re-)measure after the part, into $OUT/also
  work="$(mktemp -d /tmp/ostinato-fusion-XXXX)"
  timeout --signal=INT --kill-after=20 "${ALSO_TIMEOUT:-120}" "$PY" bench/run_suite.py --device cuda --configs "$ALSO" \
    --runners "${RUNNERS:-eager,cuda_graph_eager,torch_compile_ro,ostinato_replay,ostinato_replay_unfused}" \
    --no-startup --workdir "$work" --out "$OUT/also" 2>&1 | tail -12
  rm -rf "$work"
fi
