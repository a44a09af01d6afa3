#!/usr/bin/env bash
# The GPU run of issue 8 (continuous batching). Writes JSON and logs under $OUT (default ./results/gpu_batching).
# Usage: BREEZE_COMMIT=<sha> scripts/gpu_batching.sh
#   (write the sha out on the host: a copied working tree's git HEAD can be stale, as on the lent device in
#   results/batching/NOTES.md runs 3-4; estimated 4-6 minutes on an H200, mostly torch.compile of the bucket
#   shapes, ~5 units each; the step limits add up to 8 minutes)
#   1. agree_mid_fp32: mid size (full widths, few layers), FP32, uncompiled: 8 streams (half CFG) batched vs
#      each alone, prompts prefilled together and one by one, plus a 1,2 sweep as a smoke check
#   2. sweep_full_bf16: full-size Breeze architecture, seeded random weights, bf16, the batched step compiled
#      (BREEZE_FASTPATH_COMPILE=auto: on with CUDA + Triton): concurrency 1,2,4,8,16,32 (half with CFG), step
#      time split LM / codec, LM step without the codec, the batch-1 fast path on the same model for the
#      1-stream row, then the agreement at 8 streams (both prefill modes). The JSON is rewritten after each
#      phase, so a step cut short by its limit keeps what it measured.
#   3. agree_mid_fp32_compiled: step 1's agreement with the compiled step (each bucket's layers take the form
#      its row count selects, fastpath/compiled.py layer_form: frames may differ between forms even in FP32)
#   0. codec_variants: the full-size codec step per slot bucket (1, 8, 32) in true FP32 with cuDNN's heuristic,
#      FP32 with benchmark mode (the default), TF32 with benchmark mode; ms per step, SNR against FP32, and the
#      kernels of one eager 32-slot step (scripts/gpu_codec_variants.py)
#   2b. sweep_full_bf16_tf32 (TF32_SWEEP=1): step 2's sweep with BREEZE_ENGINE_CODEC_TF32=1, no agreement or batch 1
#      (the Inductor cache of step 2 makes its compile short)
# Step 2 runs every burst with the codec overlap on and off (--compare-overlap; COMPARE_OVERLAP=0 drops it),
# then profiles one codec-less burst of PROFILE_STREAMS (32) streams. A join or step still running
# after 5 s dumps the Python stacks (--stall-dump-s); TORCH_LOGS=recompiles names any recompilation.
# Steps run independently, each under its own time limit: a failing step is reported and the next one runs.
# Knobs: BENCH_FRAMES (64), BENCH_CAPACITY (256: one attention bucket to compile; prompts + frames fit),
# BATCH_SHAPES (all: every bucket shape the engine builds for 32 streams; sweep: only those the bursts use),
# BATCH1_MS (compare with this figure instead of measuring batch 1), BREEZE_FASTPATH_COMPILE (auto),
# BREEZE_FASTPATH_TUNE (off by default; on tunes the reduction kernels, ~75 s more per shape), SKIP_MID=1, SKIP_MID_COMPILED=1, LIMIT_* (seconds).
set -u
OUT="${OUT:-results/gpu_batching}"
mkdir -p "$OUT"
export PYTHONPATH="worker:client:protos${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export BREEZE_FASTPATH_COMPILE="${BREEZE_FASTPATH_COMPILE:-auto}"
FRAMES="${BENCH_FRAMES:-64}"
CAPACITY="${BENCH_CAPACITY:-256}"
BENCH=(python3 -m breeze_worker.cli --log-level INFO bench --device cuda --capacity "$CAPACITY")
if [ -n "${BATCH1_MS:-}" ]; then BATCH1=(--batch1-ms "$BATCH1_MS"); else BATCH1=(--batch1); fi
status=0
step() {
  local name="$1" limit="$2"; shift 2
  echo "=== $name (limit ${limit} s)"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | grep -v -e '^\[transformers\]' -e 'deprecated'
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { status=1; echo "!!! $name exited $rc$([ "$rc" = 124 ] && echo ' (time limit)')"; }
  echo "=== $name took $((SECONDS - t0)) s"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' || true
AGREE=(--agreement-streams 8 --agreement-prefill batched,per-stream)
if [ "${COMPARE_OVERLAP:-1}" = 1 ]; then OVERLAP=(--compare-overlap); else OVERLAP=(); fi
export TORCH_LOGS="${TORCH_LOGS:-recompiles}"
LEVELS="${BENCH_LEVELS:-1,2,4,8,16,32}"
[ "${SKIP_CODEC:-0}" = 1 ] || step codec_variants "${LIMIT_CODEC:-120}" python3 scripts/gpu_codec_variants.py \
  --buckets 1,8,32 --commit "${BREEZE_COMMIT:-unknown}" --json "$OUT/codec_variants.json"
[ "${SKIP_MID:-0}" = 1 ] || step agree_mid_fp32 "${LIMIT_MID:-60}" env BREEZE_FASTPATH_COMPILE=off "${BENCH[@]}" \
  --size mid --precision fp32 --concurrency 1,2 --frames 16 "${AGREE[@]}" --batch-shapes sweep \
  --json "$OUT/agree_mid_fp32.json"
step sweep_full_bf16 "${LIMIT_FULL:-300}" "${BENCH[@]}" --size full --precision bf16 \
  --concurrency "$LEVELS" --frames "$FRAMES" "${AGREE[@]}" "${BATCH1[@]}" "${OVERLAP[@]}" \
  --profile-streams "${PROFILE_STREAMS:-32}" --batch-shapes "${BATCH_SHAPES:-all}" --json "$OUT/sweep_full_bf16.json"
[ "${TF32_SWEEP:-0}" = 1 ] && step sweep_full_bf16_tf32 "${LIMIT_TF32:-200}" env BREEZE_ENGINE_CODEC_TF32=1 \
  "${BENCH[@]}" --size full --precision bf16 --concurrency "$LEVELS" --frames "$FRAMES" "${OVERLAP[@]}" \
  --batch-shapes "${BATCH_SHAPES:-all}" --json "$OUT/sweep_full_bf16_tf32.json"
[ "${SKIP_MID_COMPILED:-0}" = 1 ] || step agree_mid_fp32_compiled "${LIMIT_MID_COMPILED:-120}" "${BENCH[@]}" \
  --size mid --precision fp32 --concurrency 1,2 --frames 16 "${AGREE[@]}" --batch-shapes sweep \
  --json "$OUT/agree_mid_fp32_compiled.json"
exit $status
