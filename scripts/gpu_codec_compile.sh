#!/usr/bin/env bash
# One device call for the compiled codec step (the `codec_compile` setting) and TF32 convolutions (`codec_tf32`):
#   1. scripts/gpu_codec_variants.py at CODEC_BUCKETS (8,32): FP32 and TF32, tuned forms, compiled and not, each
#      against fp32-library (SNR), and the kernels of one step, eager and compiled;
#   2. the concurrency bench on the full-size model (bf16, 48 frames, half the streams with CFG) at LEVELS
#      (1,8,16,32), one process per codec setting in VARIANTS (default "tf32-compile fp32"): "fp32" the
#      default, "compile" / "tf32" / "tf32-compile" the settings on; BENCH_ARGS: more bench options (e.g.
#      --compare-overlap: every burst also with the codec on its own CUDA stream).
# Usage: BREEZE_COMMIT=<sha> OUT=results/batching/runN scripts/gpu_codec_compile.sh
source "$(dirname "$0")/device_env.sh"
t0=$SECONDS
if [ "${SKIP_VARIANTS:-0}" != 1 ]; then
  timeout "${LIMIT_VARIANTS:-240}" python3 scripts/gpu_codec_variants.py --buckets "${CODEC_BUCKETS:-8,32}" --repeats 20 \
    --variants fp32-tuned,tf32-tuned,fp32-tuned-compiled,tf32-tuned-compiled --commit "${BREEZE_COMMIT:-unknown}" \
    --json "$OUT/codec_variants.json" > "$OUT/codec_variants.log" 2>&1
  echo "=== codec variants exited $? after $((SECONDS - t0)) s"
  grep -A 12 '^rows ' "$OUT/codec_variants.log" | head -n 14
  grep -A 16 '^compiled step kernels' "$OUT/codec_variants.log" | head -n 17
fi
for variant in ${VARIANTS:-tf32-compile fp32}; do
  tf32=0; compile=0
  case "$variant" in *tf32*) tf32=1;; esac
  case "$variant" in *compile*) compile=1;; esac
  t1=$SECONDS
  BREEZE_ENGINE_CODEC_TF32=$tf32 BREEZE_ENGINE_CODEC_COMPILE=$compile timeout "${LIMIT_BENCH:-200}" \
    python3 -m breeze_worker.cli --log-level INFO bench --device cuda --capacity 256 --size full --precision bf16 \
    --concurrency "${LEVELS:-1,8,16,32}" --frames 48 --batch-shapes sweep ${BENCH_ARGS:-} --json "$OUT/sweep_$variant.json" \
    > "$OUT/sweep_$variant.log" 2>&1
  echo "=== concurrency bench, codec $variant (tf32=$tf32 compile=$compile), exited $? after $((SECONDS - t1)) s"
  grep -E "compiled the codec step|fell back|failed" "$OUT/sweep_$variant.log" | head -n 4
  grep -A 8 '^streams ' "$OUT/sweep_$variant.log" | head -n 8
done
