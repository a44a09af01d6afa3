#!/usr/bin/env bash
# 32 streams (half CFG, 48 frames), one process per setting: the default `gemm` form (with a kernel profile of
# one codec-less burst), then each FORM in $FORMS (default "gemm+attention"), then the library GEMMs through
# cuBLASLt (TORCH_BLAS_PREFER_CUBLASLT=1) unless SKIP_LT=1. Usage: BREEZE_COMMIT=<sha> OUT=results/batching/runN
# scripts/gpu_batch_forms.sh
source "$(dirname "$0")/device_env.sh"
B=(python3 -m breeze_worker.cli --log-level WARNING bench --device cuda --capacity 256 --size full --precision bf16
   --concurrency "${LEVELS:-32}" --frames 48 --batch-shapes sweep)
show() { grep -A2 '^streams' "$1" | cut -c1-170; grep -A22 '^kernels of' "$1" | cut -c1-150; }
t0=$SECONDS
timeout "${LIMIT_EACH:-150}" "${B[@]}" --profile-streams "${PROFILE_STREAMS:-32}" --json "$OUT/c32_gemm.json" \
  > "$OUT/c32_gemm.log" 2>&1
echo "=== gemm (+ profile) exited $? after $((SECONDS - t0)) s"; show "$OUT/c32_gemm.log"
for form in ${FORMS:-gemm+attention}; do
  t0=$SECONDS
  BREEZE_FASTPATH_FORM="$form" timeout "${LIMIT_EACH:-150}" "${B[@]}" --json "$OUT/c32_${form/+/_}.json" \
    > "$OUT/c32_${form/+/_}.log" 2>&1
  echo "=== $form exited $? after $((SECONDS - t0)) s"; show "$OUT/c32_${form/+/_}.log"
done
[ "${SKIP_LT:-0}" = 1 ] && exit 0
t0=$SECONDS
TORCH_BLAS_PREFER_CUBLASLT=1 timeout "${LIMIT_EACH:-150}" "${B[@]}" --json "$OUT/c32_cublaslt.json" > "$OUT/c32_cublaslt.log" 2>&1
echo "=== gemm via cuBLASLt exited $? after $((SECONDS - t0)) s"; show "$OUT/c32_cublaslt.log"
