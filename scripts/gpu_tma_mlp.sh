#!/usr/bin/env bash
# One device call for the MLP kernels whose operands the tensor-memory accelerator fetches (fastpath/fused_rows.py
# setting "tma"). Usage: BREEZE_COMMIT=<sha> OUT=results/gpu_runN scripts/gpu_tma_mlp.sh
# 1. scripts/gpu_rows_mlp.py: the tma settings swept at 2 and 48 rows (MLP and attention projections); the MLP per
#    layer at 2/48 rows against
#    the library form and (2 rows) the batch-1 GEMV kernels.
# 2. Frame A/B in one process (scripts/gpu_mlp_loop.py --variants): A the committed plans; B the depth MLP as the
#    tma kernels at their 2-row winners (plan "mlp_rows@1024" on); C B plus the backbone's MLP ("mlp_rows@2048").
# 3. The mid-size FP32 check (fast == eager, CFG on) with C's settings.
# 4. 32 streams (half CFG), 48 frames: `gemm` against `gemm+rows` (every layer as fused_rows.decoder_layer) with the
#    48-row winners, one process each (SKIP_BATCHING=1 skips).
source "$(dirname "$0")/device_env.sh"
t0=$SECONDS
timeout "${LIMIT_SWEEP:-150}" python3 scripts/gpu_rows_mlp.py --rows 2,48 --sweep-rows 2,48 --no-pointer --projections \
  --json "$OUT/rows_tma.json" --best-out "$OUT/rows_tma_best.json" > "$OUT/rows_tma.log" 2>&1
echo "=== sweep exited $? after $((SECONDS - t0)) s"
grep -v ' -> ' "$OUT/rows_tma.log" | tail -n 8
read -r B C BATCH < <(python3 - "$OUT/rows_tma.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
b, c, batch = {}, {}, {}
for shape in doc["shapes"]:
    two = shape["winners_by_rows"].get("2", {})
    width = shape["hidden"]
    on = {f"mlp_rows@{width}": {"on": True}, **two}
    if shape["name"] == "depth":
        b.update(on)
    c.update(on)
    batch.update(shape["winners_by_rows"].get("48", {}))
print(json.dumps(b, separators=(",", ":")), json.dumps(c, separators=(",", ":")),
      json.dumps({k: {**v, "block_m": 64} for k, v in batch.items()}, separators=(",", ":")))
PY
)
echo "B=$B"; echo "C=$C"; echo "batch=$BATCH"
t1=$SECONDS
timeout "${LIMIT_FRAME:-150}" python3 scripts/gpu_mlp_loop.py --shapes "" --frames 32 --rounds 6 \
  --variants "{\"A\":{},\"B\":$B,\"C\":$C}" --json "$OUT/frame_ab.json" > "$OUT/frame_ab.log" 2>&1
echo "=== frame A/B exited $? after $((SECONDS - t1)) s"
grep '^\[frame\]' "$OUT/frame_ab.log" | tail -n 4
t2=$SECONDS
BREEZE_FUSED_CONFIG="$C" timeout "${LIMIT_CHECK:-80}" python3 -m breeze_worker.cli --log-level WARNING bench \
  --device cuda --capacity 256 --size mid --precision fp32 --frames 12 --repeats 1 --check --cfg on \
  --paths eager,fast-compiled --json "$OUT/check_mid_tma.json" > "$OUT/check_mid_tma.log" 2>&1
echo "=== mid FP32 check with C exited $? after $((SECONDS - t2)) s"
tail -n 4 "$OUT/check_mid_tma.log"
[ "${SKIP_BATCHING:-0}" = 1 ] && exit 0
for form in gemm gemm+rows; do
  t3=$SECONDS
  config='{}'; [ "$form" = gemm+rows ] && config="$BATCH"
  BREEZE_FUSED_CONFIG="$config" BREEZE_FASTPATH_FORM="$form" timeout "${LIMIT_BATCHING:-110}" python3 -m \
    breeze_worker.cli --log-level WARNING bench --device cuda --capacity 256 --size full --precision bf16 \
    --concurrency 32 --frames 48 --batch-shapes sweep --json "$OUT/c32_${form/+/_}.json" > "$OUT/c32_${form/+/_}.log" 2>&1
  echo "=== 32 streams, $form, exited $? after $((SECONDS - t3)) s"
  tail -n 4 "$OUT/c32_${form/+/_}.log"
done
