#!/usr/bin/env bash
# One device call for the loop kernels (engine/fastpath/fused.py `per_sm`): the kernel sweep and the frame A/B
# in one process (scripts/gpu_mlp_loop.py), then the mid-size FP32 check (fast == eager, CFG on) with the
# winners exported as BREEZE_FUSED_CONFIG. Usage: BREEZE_COMMIT=<sha> OUT=results/gpu_runN scripts/gpu_mlp_loop.sh
source "$(dirname "$0")/device_env.sh"
t0=$SECONDS
timeout "${LIMIT_LOOP:-380}" python3 scripts/gpu_mlp_loop.py ${LOOP_ARGS:-} --json "$OUT/mlp_loop.json" \
  > "$OUT/mlp_loop.log" 2>&1
echo "=== loop kernels exited $? after $((SECONDS - t0)) s"
grep -v '^\[[a-z_0-9]*\] {' "$OUT/mlp_loop.log" | tail -n 30
winners="$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get("override", {})))' \
  "$OUT/mlp_loop.json" 2>/dev/null || echo '{}')"
echo "winners: $winners"
[ "$winners" = "{}" ] && exit 0
t1=$SECONDS
BREEZE_FUSED_CONFIG="$winners" timeout "${LIMIT_CHECK:-150}" python3 -m breeze_worker.cli --log-level WARNING bench \
  --device cuda --capacity 256 --size mid --precision fp32 --frames 12 --repeats 1 --check --cfg on \
  --paths eager,fast-compiled --json "$OUT/check_mid_winners.json" > "$OUT/check_mid_winners.log" 2>&1
echo "=== mid FP32 check with the winners exited $? after $((SECONDS - t1)) s"
tail -n 8 "$OUT/check_mid_winners.log"
