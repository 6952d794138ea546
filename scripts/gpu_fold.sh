#!/usr/bin/env bash
# Folded norms on the lent GPU (issue #15, passes/fold_norms.py): the CUDA tests of the row-scale kernels
# (library, attention: RMSNorm's and LayerNorm's statistics, biases) and of the folded decode steps, then
# the LayerNorm families' batched decode steps (bench/family_decode.py) against reduce-overhead, folded and
# with OSTINATO_FOLD_NORMS=0, under $OUT. STEPS picks the parts (default "tests bench"); FAMILIES, BATCH,
# LAYERS the bench's (default StableLM-2-1.6B and OLMo-1B, batch 32, 8 layers).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/ostinato-fold}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
FAMILIES="${FAMILIES:-stablelm-2-1.6b,olmo-1b}"; BATCH="${BATCH:-32}"; LAYERS="${LAYERS:-8}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
"$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
rc=0
for step in ${STEPS:-tests bench}; do
  case "$step" in
    tests)
      "$PY" -m pytest -q -m cuda -p no:cacheprovider -n 8 -rfEs tests/backends/test_triton_kernels.py \
        tests/codegen/test_cuda_fused.py -k "row_scale or row-scaled or decode_attention or folded" 2>&1 \
        | tee "$OUT/tests.log" | tail -15
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    bench)
      "$PY" bench/family_decode.py --device cuda --families "$FAMILIES" --batch "$BATCH" --layers "$LAYERS" \
        --runners eager,torch_compile_ro,ostinato_replay --out "$OUT/folded" 2>&1 | tee "$OUT/folded.log" | tail -12
      OSTINATO_FOLD_NORMS=0 "$PY" bench/family_decode.py --device cuda --families "$FAMILIES" --batch "$BATCH" \
        --layers "$LAYERS" --runners eager,ostinato_replay --out "$OUT/unfolded" 2>&1 | tee "$OUT/unfolded.log" \
        | tail -8 ;;
    *) echo "gpu_fold: unknown step $step" >&2; rc=2 ;;
  esac
done
exit $rc
