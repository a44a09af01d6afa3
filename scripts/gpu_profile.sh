#!/usr/bin/env bash
# Issue 7 on a GPU: the host-sync audit (cross-checked with torch.cuda.set_sync_debug_mode), request traces
# and the precision check. Writes JSON, traces and logs under $OUT (default ./results/profile).
#   BREEZE_PROFILE_FULL=1 also runs the precision check on the full-size random-weight architecture.
set -u
OUT="${OUT:-results/profile}"
mkdir -p "$OUT"
export PYTHONPATH="worker:client:protos${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
bw() { python3 -m breeze_worker.cli --log-level WARNING "$@"; }
status=0
step() {
  local name="$1"; shift
  echo "=== $name"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$name.log"
  [ "$rc" = 0 ] || { status=1; echo "!!! $name exited $rc"; }
  echo "=== $name took $((SECONDS - t0)) s"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
step audit_tiny bw audit-syncs --device cuda --size tiny --precision fp32 --frames 4 --json "$OUT/audit_tiny.json"
step audit_mid_eager bw audit-syncs --device cuda --size mid --precision bf16 --path eager --frames 3 \
  --json "$OUT/audit_mid_eager.json"
step audit_mid_fast bw audit-syncs --device cuda --size mid --precision bf16 --path fast --cfg --frames 4 \
  --budget 1 --json "$OUT/audit_mid_fast.json"
step trace_mid_eager bw trace --device cuda --size mid --precision bf16 --path eager --cfg --frames 6 \
  --trace "$OUT/trace_mid_eager.json"
step trace_mid_fast bw trace --device cuda --size mid --precision bf16 --path fast --cfg --frames 6 \
  --no-sync-marks --trace "$OUT/trace_mid_fast.json"
[ "${BREEZE_PROFILE_AUDIT_ONLY:-0}" = 1 ] && exit $status
step precision_mid bw precision-check --device cuda --size mid --cfg --frames 8 --json "$OUT/precision_mid.json"
if [ "${BREEZE_PROFILE_FULL:-0}" = 1 ]; then
  step precision_full bw precision-check --device cuda --size full --cfg --frames 8 --json "$OUT/precision_full.json"
fi
exit $status
