#!/usr/bin/env bash
# One device call for the L2 prefetch (engine/fastpath/prefetch.py; fused.plan "l2" and "l2_gemm", off by
# default): the weights of a layer's MLP asked into L2 while the layer's attention half runs.
# 1. The frame A/B at batch 1 with CFG in one process (scripts/gpu_mlp_loop.py --variants; frames must be
#    identical to A: a prefetch cannot change the arithmetic): A off; B/C the depth layers' q/k/v kernel asks
#    for half / all of the gate/up rows; D/E B/C plus the gate/up kernel asking for the down projection and
#    the down kernel for the next layer's q/k/v and output projection; F D plus the backbone's layers;
#    G only the next layer's q/k/v and output projection; Z = A again (the noise between two runs of one code).
# 2. 32 streams (half CFG), the batched step (library GEMMs), one process per setting: "l2_gemm" off, on at
#    two shares, off again.
# Usage: BREEZE_COMMIT=<sha> OUT=$OUT/gpu_run39 scripts/gpu_l2_prefetch.sh
source "$(dirname "$0")/device_env.sh"
D='"l2@1024": {"on": true'
t0=$SECONDS
timeout "${LIMIT_FRAME:-300}" python3 scripts/gpu_mlp_loop.py --shapes "" --json "$OUT/frame_ab.json" \
  --variants "{\"A\": {}, \"B\": {$D, \"gate_up\": 0.5}}, \"C\": {$D, \"gate_up\": 1.0}},
              \"D\": {$D, \"gate_up\": 0.5, \"down\": 1.0, \"next\": 1.0}},
              \"E\": {$D, \"gate_up\": 1.0, \"down\": 1.0, \"next\": 1.0}},
              \"F\": {$D, \"gate_up\": 0.5, \"down\": 1.0, \"next\": 1.0},
                      \"l2@2048\": {\"on\": true, \"gate_up\": 0.5, \"down\": 0.5, \"next\": 1.0}},
              \"G\": {$D, \"gate_up\": 0.0, \"next\": 1.0}}, \"Z\": {}}" > "$OUT/frame_ab.log" 2>&1
echo "=== frame A/B exited $? after $((SECONDS - t0)) s"
grep '^\[frame\]' "$OUT/frame_ab.log" | tail -n 9
[ "${SKIP_BATCHING:-0}" = 1 ] && exit 0
B=(python3 -m breeze_worker.cli --log-level WARNING bench --device cuda --capacity 256 --size full --precision bf16
   --concurrency 32 --frames 48 --batch-shapes sweep)
for v in off:'{}' gu05:'{"l2_gemm": {"on": true, "gate_up": 0.5}}' \
         gu10d05:'{"l2_gemm": {"on": true, "gate_up": 1.0, "down": 0.5}}' off2:'{}'; do
  name=${v%%:*}
  t1=$SECONDS
  echo "=== c32 $name ${v#*:}" >> "$OUT/batching.log"
  BREEZE_FUSED_CONFIG="${v#*:}" timeout "${LIMIT_BATCH:-150}" "${B[@]}" --json "$OUT/c32_$name.json" \
    >> "$OUT/batching.log" 2>&1
  echo "=== c32 $name exited $? after $((SECONDS - t1)) s"
  python3 - "$OUT/c32_$name.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print({k: r.get(k) for k in ("streams", "aggregate_x_realtime", "steady_x_realtime", "step_ms_p50", "lm_ms_p50",
                                 "codec_ms_p50", "lm_only_step_ms_p50", "stream_rtf_max", "ttfa_ms_p95")})
PY
done
