#!/usr/bin/env bash
# Batched layer forms at 32 streams, one device call: the in-process A/B of $FORMS (scripts/gpu_batch_ab.py),
# then a kernel profile of one codec-less burst per form in $PROFILE_FORMS (its own process each).
# Usage: BREEZE_COMMIT=<sha> OUT=results/batching/runN scripts/gpu_ab_profile.sh
source "$(dirname "$0")/device_env.sh"
t0=$SECONDS
timeout "${LIMIT_AB:-300}" python3 scripts/gpu_batch_ab.py --json "$OUT/ab.json" \
  --forms "${FORMS:-gemm,gemm+attention}" --rounds "${ROUNDS:-4}" > "$OUT/ab.log" 2>&1
echo "=== A/B exited $? after $((SECONDS - t0)) s"; grep '^\[ab\]' "$OUT/ab.log" | tail -12
for form in ${PROFILE_FORMS:-gemm+attention}; do
  t0=$SECONDS
  BREEZE_FASTPATH_FORM="$form" timeout "${LIMIT_EACH:-150}" python3 -m breeze_worker.cli --log-level WARNING bench \
    --device cuda --capacity 256 --size full --precision bf16 --concurrency 32 --frames 48 --batch-shapes sweep \
    --profile-streams 32 --json "$OUT/profile_${form/+/_}.json" > "$OUT/profile_${form/+/_}.log" 2>&1
  echo "=== profile $form exited $? after $((SECONDS - t0)) s"
  grep -A2 '^streams' "$OUT/profile_${form/+/_}.log" | cut -c1-170
  grep -A24 '^kernels of' "$OUT/profile_${form/+/_}.log" | cut -c1-160
done
