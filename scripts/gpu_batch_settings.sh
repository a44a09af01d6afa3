#!/usr/bin/env bash
# One device call for the batched step's settings: the in-process A/B of the half-precision logits GEMM
# (plan "logits_mm", on by default) against the FP32 copies + SIMT GEMM (scripts/gpu_batch_ab.py), then the
# concurrency bench at 32 streams (half CFG, 48 frames) per opt-in codec setting in CODECS (default
# "compile tf32-compile": BREEZE_ENGINE_CODEC_COMPILE / _TF32), then issue 8's default sweep (LEVELS, default
# 1,2,4,8,16,32, with the batch-1 comparison) unless SKIP_SWEEP=1. AB_VARIANTS: other A/B variants (one
# "label=form|{json}" a line); SKIP_AB=1: no A/B; JOIN_PROFILE=1: also scripts/gpu_join_profile.py after the
# A/B; SWEEP_ENV: settings for the sweep (e.g. "BREEZE_ENGINE_CODEC_TF32=1 BREEZE_ENGINE_CODEC_COMPILE=1"),
# SWEEP_NAME a suffix for its files.
# Usage: BREEZE_COMMIT=<sha> OUT=results/batching/runN scripts/gpu_batch_settings.sh
source "$(dirname "$0")/device_env.sh"
B=(python3 -m breeze_worker.cli --log-level WARNING bench --device cuda --capacity 256 --size full --precision bf16
   --frames 48 --batch-shapes sweep)
rows() { grep -A9 '^streams' "$1" | cut -c1-170; grep -A1 '^targets' "$1" | cut -c1-250; }
# the A/B's variants, one per line (label=form|{json}); run 23's pair unless AB_VARIANTS names others
AB_VARIANTS=${AB_VARIANTS:-'gemm+attention=gemm+attention
gemm+attention-fp32-heads=gemm+attention|{"logits_mm": {"on": false}}'}
ab_args=(); while IFS= read -r v; do [ -n "$v" ] && ab_args+=(--variant "$v"); done <<< "$AB_VARIANTS"
if [ "${SKIP_AB:-0}" != 1 ]; then
  t0=$SECONDS
  timeout "${LIMIT_AB:-200}" python3 scripts/gpu_batch_ab.py --json "$OUT/ab.json" --rounds "${ROUNDS:-3}" \
    "${ab_args[@]}" > "$OUT/ab.log" 2>&1
  echo "=== A/B exited $? after $((SECONDS - t0)) s"; grep '^\[ab\]' "$OUT/ab.log" | tail -${#ab_args[@]}
fi
if [ "${JOIN_PROFILE:-0}" = 1 ]; then  # the join and the first steps after it, profiled (scripts/gpu_join_profile.py)
  t0=$SECONDS
  timeout "${LIMIT_JOIN:-120}" python3 scripts/gpu_join_profile.py --json "$OUT/join.json" > "$OUT/join.log" 2>&1
  echo "=== join profile exited $? after $((SECONDS - t0)) s"; grep -v '^\[' "$OUT/join.log" | cut -c1-150 | head -120
fi
for codec in ${CODECS-compile tf32-compile}; do  # CODECS="" runs none
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
env ${SWEEP_ENV:-} timeout "${LIMIT_SWEEP:-200}" "${B[@]}" --concurrency "${LEVELS:-1,2,4,8,16,32}" --batch1 \
  --json "$OUT/sweep${SWEEP_NAME:-}.json" > "$OUT/sweep${SWEEP_NAME:-}.log" 2>&1
echo "=== sweep ${SWEEP_ENV:-(default settings)} exited $? after $((SECONDS - t0)) s"; rows "$OUT/sweep${SWEEP_NAME:-}.log"
