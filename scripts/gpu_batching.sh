#!/usr/bin/env bash
# The GPU run of issue 8 (continuous batching). Writes JSON and logs under $OUT (default ./results/gpu_batching).
# Usage: BREEZE_COMMIT=$(git rev-parse HEAD) scripts/gpu_batching.sh
#   1. correctness: mid-size (full widths, few layers), FP32 on the GPU: 8 streams (half CFG) batched vs each
#      alone, fraction of identical frames (plus a tiny 1,2 sweep as a smoke check)
#   2. full-size Breeze architecture, seeded random weights, bf16: concurrency 1,2,4,8,16,32, half with CFG,
#      with the batched-vs-alone agreement at 8 streams
set -u
OUT="${OUT:-results/gpu_batching}"
mkdir -p "$OUT"
export PYTHONPATH="worker:client:protos${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export BREEZE_FASTPATH_COMPILE="${BREEZE_FASTPATH_COMPILE:-off}"
FRAMES="${BENCH_FRAMES:-64}"
bench() { python3 -m breeze_worker.cli --log-level INFO bench --device cuda "$@"; }
status=0
step() {
  local name="$1"; shift
  echo "=== $name"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { status=1; echo "!!! $name exited $rc"; }
  echo "=== $name took $((SECONDS - t0)) s"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
step agree_mid_fp32 bench --size mid --precision fp32 --concurrency 1,2 --frames 16 --agreement-streams 8 \
  --json "$OUT/agree_mid_fp32.json"
step sweep_full_bf16 bench --size full --precision bf16 --concurrency 1,2,4,8,16,32 --frames "$FRAMES" \
  --agreement-streams 8 --batch1-ms "${BATCH1_MS:-20.1}" --json "$OUT/sweep_full_bf16.json"
exit $status
