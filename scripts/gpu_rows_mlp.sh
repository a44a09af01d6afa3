#!/usr/bin/env bash
# Device calls for the "gemm+mlp" form (engine/fastpath/fused_rows.py: the MLP of batched steps as two tensor-core
# kernels). Usage: BREEZE_COMMIT=<sha> OUT=results/batching/runN STEP=kernels|batching scripts/gpu_rows_mlp.sh
#   STEP=kernels (~5 min): scripts/gpu_rows_mlp.py (launch settings at 48 rows; the MLP per layer at 16/32/48 rows
#     vs the library form), then the mid-size FP32 check (fast == eager, CFG on) with the form forced, so the
#     kernels run at 2 rows in IEEE FP32, with the winners exported as BREEZE_FUSED_CONFIG
#   STEP=batching (~5 min): 32 streams (half CFG), 48 frames, the default "gemm" form and "gemm+mlp" (winners
#     from $OUT/rows_best.json if there), each in its own process
source "$(dirname "$0")/device_env.sh"
winners() { cat "$OUT/rows_best.json" 2>/dev/null || echo '{}'; }
BENCH=(python3 -m breeze_worker.cli --log-level INFO bench --device cuda --capacity 256)
case "${STEP:-kernels}" in
  kernels)
    t0=$SECONDS
    timeout "${LIMIT_KERNELS:-300}" python3 scripts/gpu_rows_mlp.py --json "$OUT/rows_mlp.json" \
      --best-out "$OUT/rows_best.json" > "$OUT/rows_mlp.log" 2>&1
    echo "=== rows kernels exited $? after $((SECONDS - t0)) s"
    grep -v ' -> ' "$OUT/rows_mlp.log" | tail -n 20
    t1=$SECONDS
    BREEZE_FUSED_CONFIG="$(winners)" BREEZE_FASTPATH_FORM=gemm+mlp timeout "${LIMIT_CHECK:-150}" "${BENCH[@]}" \
      --size mid --precision fp32 --frames 12 --repeats 1 --check --cfg on --paths eager,fast-compiled \
      --json "$OUT/check_mid_gemm_mlp.json" > "$OUT/check_mid_gemm_mlp.log" 2>&1
    echo "=== mid FP32 check, gemm+mlp, exited $? after $((SECONDS - t1)) s"
    tail -n 6 "$OUT/check_mid_gemm_mlp.log"
    ;;
  batching)
    for form in gemm gemm+mlp; do
      t0=$SECONDS
      config='{}'; [ "$form" = gemm+mlp ] && config="$(winners)"
      BREEZE_FUSED_CONFIG="$config" BREEZE_FASTPATH_FORM="$form" timeout "${LIMIT_BATCHING:-280}" "${BENCH[@]}" \
        --size full --precision bf16 --concurrency "${LEVELS:-32}" --frames 48 --batch-shapes sweep \
        --json "$OUT/batching_${form/+/_}.json" > "$OUT/batching_${form/+/_}.log" 2>&1
      echo "=== $form exited $? after $((SECONDS - t0)) s"
      tail -n 12 "$OUT/batching_${form/+/_}.log"
    done
    ;;
  *) echo "STEP must be kernels or batching"; exit 2 ;;
esac
