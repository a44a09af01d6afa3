#!/usr/bin/env bash
# One device call for the batched step's settings: the in-process A/B of the half-precision logits GEMM
# (plan "logits_mm", on by default) against the FP32 copies + SIMT GEMM (scripts/gpu_batch_ab.py), then the
# concurrency bench at 32 streams (half CFG, 48 frames) per opt-in codec setting in CODECS (default
# "compile tf32-compile": BREEZE_ENGINE_CODEC_COMPILE / _TF32), then issue 8's default sweep (LEVELS, default
# 1,2,4,8,16,32, with the batch-1 comparison) unless SKIP_SWEEP=1.
# Usage: BREEZE_COMMIT=<sha> OUT=results/batching/runN scripts/gpu_batch_settings.sh
source "$(dirname "$0")/device_env.sh"
B=(python3 -m breeze_worker.cli --log-level WARNING bench --device cuda --capacity 256 --size full --precision bf16
   --frames 48 --batch-shapes sweep)
rows() { grep -A9 '^streams' "$1" | cut -c1-170; grep -A1 '^targets' "$1" | cut -c1-250; }
t0=$SECONDS
timeout "${LIMIT_AB:-200}" python3 scripts/gpu_batch_ab.py --json "$OUT/ab.json" --rounds "${ROUNDS:-3}" \
  --variant gemm+attention=gemm+attention \
  --variant 'gemm+attention-fp32-heads=gemm+attention|{"logits_mm": {"on": false}}' > "$OUT/ab.log" 2>&1
echo "=== A/B exited $? after $((SECONDS - t0)) s"; grep '^\[ab\]' "$OUT/ab.log" | tail -3
for codec in ${CODECS:-compile tf32-compile}; do
  tf32=0; compile=0
  case "$codec" in *tf32*) tf32=1;; esac
  case "$codec" in *compile*) compile=1;; esac
  t0=$SECONDS
  BREEZE_ENGINE_CODEC_TF32=$tf32 BREEZE_ENGINE_CODEC_COMPILE=$compile timeout "${LIMIT_EACH:-130}" "${B[@]}" \
    --concurrency 32 --json "$OUT/c32_$codec.json" > "$OUT/c32_$codec.log" 2>&1
  echo "=== codec $codec exited $? after $((SECONDS - t0)) s"; rows "$OUT/c32_$codec.log"
done
[ "${SKIP_SWEEP:-0}" = 1 ] && exit 0
t0=$SECONDS
timeout "${LIMIT_SWEEP:-200}" "${B[@]}" --concurrency "${LEVELS:-1,2,4,8,16,32}" --batch1 --json "$OUT/sweep.json" \
  > "$OUT/sweep.log" 2>&1
echo "=== default sweep exited $? after $((SECONDS - t0)) s"; rows "$OUT/sweep.log"
