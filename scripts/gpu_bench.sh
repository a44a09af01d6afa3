#!/usr/bin/env bash
# The one script the GPU device runs (issue 6): correctness first, then timings. Writes JSON and logs
# under $OUT (default ./results/gpu). Usage: BREEZE_COMMIT=<sha> scripts/gpu_bench.sh (the sha as the host's
# `git rev-parse HEAD` gives it: a copied working tree's git HEAD can be stale)
#   1. mid-size config (full widths, few layers), FP32 on the GPU: eager frames == fast-path frames, for the
#      uncompiled and the torch.compile'd fast path, CFG off and on
#   2. full-size Breeze architecture, seeded random weights, full-size codec decoder: eager vs fast
#      (uncompiled and compiled), CFG off/on, bf16
#   3. the same, fp16-mixed (the T4 policy), CFG on
# Optional, before them: RUN_SAMPLING=1 (scripts/gpu_sampling.py: the sampling kernel checked and timed);
# after them: RUN_BACKBONE=1 (scripts/gpu_backbone.py: the backbone's fused kernels, launch settings).
# Steps run independently, each under its own time limit: a failing step is reported and the next one runs.
set -u
OUT="${OUT:-results/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="worker:client:protos${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
FRAMES="${BENCH_FRAMES:-64}"
EAGER_FRAMES="${BENCH_EAGER_FRAMES:-16}"
CAPACITY="${BENCH_CAPACITY:-512}"  # backbone slots: 2 attention buckets (256, 512) to capture and compile
# decode paths: eager, fast-uncompiled, fast-compiled[:FORM] (FORM: the compiled layers' form, fastpath/forms.py;
# fast-compiled alone = the default choice)
PATHS="${BENCH_PATHS:-eager,fast-uncompiled,fast-compiled:gemm,fast-compiled}"
CHECK_PATHS="${BENCH_CHECK_PATHS:-$PATHS}"
FP16_PATHS="${BENCH_FP16_PATHS:-eager,fast-compiled}"
CFGS="${BENCH_CFG:-off,on}"
BENCH=(python3 -m breeze_worker.cli --log-level WARNING bench --device cuda --capacity "$CAPACITY")
status=0
step() {
  local name="$1" limit="$2"; shift 2
  echo "=== $name (limit ${limit} s)"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  [ "$rc" = 0 ] || { status=1; echo "!!! $name exited $rc"; }
  echo "=== $name took $((SECONDS - t0)) s"
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' || true
[ "${RUN_SAMPLING:-0}" = 1 ] && step sampling "${LIMIT_SAMPLING:-150}" python3 scripts/gpu_sampling.py \
  --json "$OUT/sampling.json" --best-out "$OUT/sampling_best.json"
# USE_SAMPLING_BEST=1: the benches below run the sampling kernel with the settings it chose
if [ "${USE_SAMPLING_BEST:-0}" = 1 ] && [ -s "$OUT/sampling_best.json" ]; then
  export BREEZE_FUSED_CONFIG="$(cat "$OUT/sampling_best.json")"
  echo "BREEZE_FUSED_CONFIG=$BREEZE_FUSED_CONFIG"
fi
[ "${SKIP_CHECK:-0}" = 1 ] || step check_mid "${LIMIT_CHECK:-150}" "${BENCH[@]}" --size mid --precision fp32 \
  --frames 12 --repeats 1 --check --cfg "$CFGS" --paths "$CHECK_PATHS" --json "$OUT/check_mid.json"
[ "${SKIP_BF16:-0}" = 1 ] || step full_bf16 "${LIMIT_BF16:-230}" "${BENCH[@]}" --size full --precision bf16 \
  --frames "$FRAMES" --eager-frames "$EAGER_FRAMES" --repeats 3 --cfg "$CFGS" --paths "$PATHS" \
  --json "$OUT/full_bf16.json"
[ "${SKIP_FP16:-0}" = 1 ] || step full_fp16mixed "${LIMIT_FP16:-100}" "${BENCH[@]}" --size full \
  --precision fp16-mixed --cfg on --frames "$FRAMES" --eager-frames "$EAGER_FRAMES" --repeats 3 --paths "$FP16_PATHS" \
  --force-precision --json "$OUT/full_fp16mixed.json"
[ "${RUN_BACKBONE:-0}" = 1 ] && step backbone "${LIMIT_BACKBONE:-240}" python3 scripts/gpu_backbone.py \
  --json "$OUT/backbone.json" --best-out "$OUT/backbone_best.json"
exit $status
