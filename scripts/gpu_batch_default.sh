#!/usr/bin/env bash
# The batched step's default form, one device call: the in-process A/B of VARIANTS (scripts/gpu_batch_ab.py;
# default: `gemm`, `gemm+attention` as it runs by default, and `gemm+attention` with the grouped attention kernel at
# every row count), then issue 8's sweep at LEVELS (default 1,2,4,8,16,32; half the streams with CFG, 48 frames,
# the default FP32 codec) with the batch-1 comparison and a kernel profile of one 32-stream burst.
# Usage: BREEZE_COMMIT=<sha> OUT=results/batching/runN scripts/gpu_batch_default.sh
source "$(dirname "$0")/device_env.sh"
t0=$SECONDS
if [ "${SKIP_AB:-0}" != 1 ]; then
  timeout "${LIMIT_AB:-260}" python3 scripts/gpu_batch_ab.py --json "$OUT/ab.json" --rounds "${ROUNDS:-4}" \
    --variant gemm=gemm --variant gemm+attention=gemm+attention \
    --variant 'gemm+attention-grouped=gemm+attention|{"depth_attention": {"per_head_rows": 1000}}' \
    > "$OUT/ab.log" 2>&1
  echo "=== A/B exited $? after $((SECONDS - t0)) s"; grep '^\[ab\]' "$OUT/ab.log" | tail -16
fi
t0=$SECONDS
timeout "${LIMIT_SWEEP:-280}" python3 -m breeze_worker.cli --log-level WARNING bench --device cuda --capacity 256 \
  --size full --precision bf16 --concurrency "${LEVELS:-1,2,4,8,16,32}" --frames 48 --batch-shapes sweep --batch1 \
  --profile-streams "${PROFILE_STREAMS:-32}" --json "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
echo "=== sweep exited $? after $((SECONDS - t0)) s"
grep -A9 '^streams' "$OUT/sweep.log" | cut -c1-170; grep -A3 '^targets' "$OUT/sweep.log" | cut -c1-250
grep -A24 '^kernels of' "$OUT/sweep.log" | cut -c1-150
