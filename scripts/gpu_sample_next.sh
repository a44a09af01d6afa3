#!/usr/bin/env bash
# One device call for the sampling kernel's three additions and the overlapped host read (run 33):
# fused.plan "sample" `early` (the top-k search stops where exactly k keys pass), `next` (the kernel writes
# the next depth position's input from the table of projected codes, FrameStep; no gather + projection
# kernels), `pdl` (the kernel chained like the layers' kernels), and graph.read_overlap_wanted (the next
# backbone step queued before the frame's host read).
# 1. scripts/gpu_sampling.py: the kernel against the torch sampler (both search forms), the position timed.
# 2. The frame A/B in one process (scripts/gpu_mlp_loop.py): A the committed behaviour (all four off), B the
#    new defaults, C `next` only, D `early` + `pdl` only, G the kernel's three without the overlapped read,
#    E = A again (the noise between two runs of one code).
# 3. The mid-size FP32 check (fast == eager, CFG off and on) with the new defaults.
# Usage: BREEZE_COMMIT=<sha> OUT=results/gpu_runN scripts/gpu_sample_next.sh
source "$(dirname "$0")/device_env.sh"
t0=$SECONDS
timeout "${LIMIT_SAMPLING:-120}" python3 scripts/gpu_sampling.py --json "$OUT/sampling.json" \
  --candidates '[{"early": false, "pdl": false}, {"early": true, "pdl": false}]' > "$OUT/sampling.log" 2>&1
echo "=== sampling exited $? after $((SECONDS - t0)) s"
grep -v '^{' "$OUT/sampling.log" | tail -n 12
grep -c '"ok": true' "$OUT/sampling.log"
OLD='"sample": {"early": false, "next": false, "pdl": false}, "_read_overlap": false'
t1=$SECONDS
timeout "${LIMIT_FRAME:-300}" python3 scripts/gpu_mlp_loop.py --shapes "" --json "$OUT/frame_ab.json" \
  --variants "{\"A\": {$OLD}, \"B\": {}, \"C\": {\"sample\": {\"early\": false, \"pdl\": false}, \"_read_overlap\": false},
              \"D\": {\"sample\": {\"next\": false}, \"_read_overlap\": false}, \"G\": {\"_read_overlap\": false},
              \"E\": {$OLD}}" > "$OUT/frame_ab.log" 2>&1
echo "=== frame A/B exited $? after $((SECONDS - t1)) s"
grep '^\[frame\]' "$OUT/frame_ab.log" | tail -n 14
t2=$SECONDS
timeout "${LIMIT_CHECK:-140}" python3 -m breeze_worker.cli \
  --log-level WARNING bench --device cuda --capacity 256 --size mid --precision fp32 --frames 12 --repeats 1 \
  --check --cfg off,on --paths eager,fast-compiled --json "$OUT/check_mid.json" > "$OUT/check_mid.log" 2>&1
echo "=== mid FP32 check exited $? after $((SECONDS - t2)) s"
grep -E "^fast == eager|^targets" "$OUT/check_mid.log"
