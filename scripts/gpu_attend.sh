#!/usr/bin/env bash
# One device call for the depth attention inside the q/k/v kernel (fused.plan "qkv_rope" `attend`):
# scripts/gpu_attend.py (checks against the committed chain and torch; the layer step at four settings), the
# frame A/B in one process (A the committed plans, B `attend`, C the fastest `attend` setting of the layer
# step, E the committed plans again: the noise between two runs of one code), then the mid-size FP32 check
# (fast == eager, CFG off and on) with `attend`. Usage: BREEZE_COMMIT=<sha> OUT=results/gpu_runN scripts/gpu_attend.sh
source "$(dirname "$0")/device_env.sh"
t0=$SECONDS
timeout "${LIMIT_ATTEND:-200}" python3 scripts/gpu_attend.py --json "$OUT/attend.json" > "$OUT/attend.log" 2>&1
echo "=== attend exited $? after $((SECONDS - t0)) s"
tail -n 14 "$OUT/attend.log"
best="$(python3 - "$OUT/attend.json" <<'PY' 2>/dev/null || echo '{"qkv_rope": {"attend": true}}'
import json, sys
sys.path.insert(0, "scripts")
from gpu_attend import VARIANTS
step = json.load(open(sys.argv[1]))["layer_steps"][0]
label = min((k for k in VARIANTS if k != "chain"), key=lambda k: step[f"{k}_us"])
print(json.dumps(VARIANTS[label]))
PY
)"
echo "fastest attend setting: $best"
t1=$SECONDS
timeout "${LIMIT_FRAME:-220}" python3 scripts/gpu_mlp_loop.py --shapes "" --json "$OUT/frame_ab.json" \
  --variants "{\"A\": {}, \"B\": {\"qkv_rope\": {\"attend\": true}}, \"C\": $best, \"E\": {}}" > "$OUT/frame_ab.log" 2>&1
echo "=== frame A/B exited $? after $((SECONDS - t1)) s"
grep '^\[frame\] [A-Z]:' "$OUT/frame_ab.log"
t2=$SECONDS
BREEZE_FUSED_CONFIG="$best" timeout "${LIMIT_CHECK:-150}" python3 -m breeze_worker.cli \
  --log-level WARNING bench --device cuda --capacity 256 --size mid --precision fp32 --frames 12 --repeats 1 \
  --check --cfg off,on --paths eager,fast-compiled --json "$OUT/check_mid_attend.json" > "$OUT/check_mid_attend.log" 2>&1
echo "=== mid FP32 check, attend, exited $? after $((SECONDS - t2)) s"
grep -E "^fast == eager|^targets" "$OUT/check_mid_attend.log"
