#!/usr/bin/env bash
# Issue 6's batch-1 figure in several processes on one machine (the spread between processes is larger than
# within one; results/NOTES.md runs 25, 43-44). Usage: BREEZE_COMMIT=<sha> OUT=results/gpu_runN
# [PROCESSES=4] scripts/gpu_bench_processes.sh. Process 1 also times the eager reference (the x-eager ratio);
# even processes time CFG off first, odd ones CFG on only.
source "$(dirname "$0")/device_env.sh"
BENCH=(python3 -m breeze_worker.cli --log-level WARNING bench --device cuda --capacity 256 --size full
       --precision bf16 --frames 64 --repeats 3)
for i in $(seq 1 "${PROCESSES:-4}"); do
  case "$i" in
    1) args=(--cfg off,on --paths eager,fast-compiled --eager-frames 8) ;;
    *) if [ $((i % 2)) = 0 ]; then args=(--cfg off,on --paths fast-compiled); else args=(--cfg on --paths fast-compiled); fi ;;
  esac
  t0=$SECONDS
  timeout "${LIMIT_EACH:-140}" "${BENCH[@]}" "${args[@]}" --json "$OUT/full_bf16_p$i.json" > "$OUT/full_bf16_p$i.log" 2>&1
  echo "=== p$i (${args[*]}) exited $? after $((SECONDS - t0)) s"
  grep '^\[fast-compiled/cfg/bf16\] ms/frame\|^\[eager/cfg/bf16\] ms/frame\|^targets' "$OUT/full_bf16_p$i.log" | cut -c1-160
done
