#!/usr/bin/env bash
# One device call for the fused depth layer (engine/fastpath/fused.py): the kernels' check and launch
# settings (scripts/gpu_fused.py), then the bench with the chosen settings exported as BREEZE_FUSED_CONFIG:
# mid-size FP32 frames (eager == fused), full-size bf16 batch 1 CFG on (eager, the default fused, units+attn), and
# eager and fused under fp16-mixed (the T4 policy). Usage: BREEZE_COMMIT=<sha> OUT=results/gpu_runN scripts/gpu_fused.sh
set -u
OUT="${OUT:-results/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="worker:client:protos${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
t0=$SECONDS
timeout "${LIMIT_FUSED:-140}" python3 scripts/gpu_fused.py ${FUSED_ARGS:-} --json "$OUT/fused_kernels.json" \
  --best-out "$OUT/fused_best.json" > "$OUT/fused_kernels.log" 2>&1
echo "=== fused kernels exited $? after $((SECONDS - t0)) s"
tail -n 30 "$OUT/fused_kernels.log"
# USE_BEST=0: the bench runs the committed launch plans (fused.plan), not the ones just timed
BREEZE_FUSED_CONFIG=""
[ "${USE_BEST:-1}" = 0 ] || BREEZE_FUSED_CONFIG="$(cat "$OUT/fused_best.json" 2>/dev/null || true)"
export BREEZE_FUSED_CONFIG="${BREEZE_FUSED_CONFIG:-}"
echo "BREEZE_FUSED_CONFIG=$BREEZE_FUSED_CONFIG"
SKIP_GEMV=1 BENCH_CAPACITY=256 BENCH_FRAMES="${BENCH_FRAMES:-32}" BENCH_EAGER_FRAMES=8 BENCH_CFG=on \
  BENCH_PATHS="${BENCH_PATHS:-eager,fast-compiled,fast-compiled:units+attn}" \
  BENCH_CHECK_PATHS="${BENCH_CHECK_PATHS:-eager,fast-compiled}" \
  BENCH_FP16_PATHS="${BENCH_FP16_PATHS:-eager,fast-compiled}" \
  LIMIT_CHECK="${LIMIT_CHECK:-100}" LIMIT_BF16="${LIMIT_BF16:-250}" LIMIT_FP16="${LIMIT_FP16:-90}" \
  OUT="$OUT" bash scripts/gpu_bench.sh
