#!/usr/bin/env bash
# One device call for the sampling kernel's split layout (fused.plan "sample" setting "split": 2051 classes as
# 2048 + 4 lanes instead of one block of 4096): scripts/gpu_sampling.py (both layouts checked against the
# torch sampler, launch settings timed), the frame A/B in one process (A the committed plan, split since run 31;
# B unsplit at the committed radix and warps; C the fastest setting of the sweep), then the mid-size FP32 check
# (fast == eager, CFG on and off) with split on. Usage: BREEZE_COMMIT=<sha> OUT=results/gpu_runN scripts/gpu_sampling_split.sh
source "$(dirname "$0")/device_env.sh"
t0=$SECONDS
timeout "${LIMIT_SAMPLING:-150}" python3 scripts/gpu_sampling.py --json "$OUT/sampling.json" \
  --best-out "$OUT/sampling_best.json" > "$OUT/sampling.log" 2>&1
echo "=== sampling exited $? after $((SECONDS - t0)) s"
grep -v '^{' "$OUT/sampling.log" | tail -n 12
best="$(cat "$OUT/sampling_best.json" 2>/dev/null || echo '{}')"
[ "$best" = "{}" ] && best='{"sample": {"split": true}}'
t1=$SECONDS
timeout "${LIMIT_FRAME:-200}" python3 scripts/gpu_mlp_loop.py --shapes "" --json "$OUT/frame_ab.json" \
  --variants "{\"A\": {}, \"B\": {\"sample\": {\"split\": false}}, \"C\": $best}" > "$OUT/frame_ab.log" 2>&1
echo "=== frame A/B exited $? after $((SECONDS - t1)) s"
grep '^\[frame\] [A-Z]:' "$OUT/frame_ab.log"
t2=$SECONDS
BREEZE_FUSED_CONFIG='{"sample": {"split": true}}' timeout "${LIMIT_CHECK:-150}" python3 -m breeze_worker.cli \
  --log-level WARNING bench --device cuda --capacity 256 --size mid --precision fp32 --frames 12 --repeats 1 \
  --check --cfg off,on --paths eager,fast-compiled --json "$OUT/check_mid_split.json" > "$OUT/check_mid_split.log" 2>&1
echo "=== mid FP32 check, split, exited $? after $((SECONDS - t2)) s"
grep -E "^fast == eager|^targets" "$OUT/check_mid_split.log"
