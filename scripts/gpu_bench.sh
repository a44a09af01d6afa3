#!/usr/bin/env bash
# The one script the GPU device runs (issue 6): correctness first, then timings. Writes JSON and logs
# under $OUT (default ./results/gpu). Usage: BREEZE_COMMIT=$(git rev-parse HEAD) scripts/gpu_bench.sh
#   1. tiny and mid-size configs, FP32 on the GPU: fast-path frames == eager frames (CFG off and on)
#   2. mid-size: fp16-mixed and bf16 first-frame logits against FP32 (teacher-forced)
#   3. full-size Breeze architecture, seeded random weights: eager vs fast, CFG off/on, bf16 then fp16-mixed
# Steps run independently: a failing step is reported and the next one still runs.
set -u
OUT="${OUT:-results/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="worker:client:protos${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
FRAMES="${BENCH_FRAMES:-64}"
EAGER_FRAMES="${BENCH_EAGER_FRAMES:-16}"
bench() { python3 -m breeze_worker.cli --log-level WARNING bench --device cuda "$@"; }
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
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
step check_tiny bench --size tiny --precision fp32 --frames 12 --repeats 1 --check --json "$OUT/check_tiny.json"
step check_mid bench --size mid --precision fp32 --frames 12 --repeats 1 --check \
  --agreement fp16-mixed,bf16 --json "$OUT/check_mid.json"
step full_bf16 bench --size full --precision bf16 --frames "$FRAMES" --eager-frames "$EAGER_FRAMES" --repeats 3 \
  --json "$OUT/full_bf16.json"
step full_fp16mixed bench --size full --precision fp16-mixed --frames "$FRAMES" --eager-frames "$EAGER_FRAMES" \
  --repeats 3 --force-precision --json "$OUT/full_fp16mixed.json"
exit $status
