#!/usr/bin/env bash
# Nsight Compute on the depth layer's kernels at 2 rows (scripts/gpu_ncu_mlp.py): per kernel the memory
# throughput against its ceiling, achieved occupancy, registers, and where warps stall. Clocks left alone.
# Usage: OUT=$OUT/gpu_run42 scripts/gpu_ncu_mlp.sh
source "$(dirname "$0")/device_env.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
echo "ncu: $NCU"
"$NCU" --version | tail -n 1
timeout "${LIMIT_NCU:-240}" "$NCU" --clock-control none --target-processes all \
  -k 'regex:_norm_gate_up_kernel|_down_residual_kernel|_qkv_rope_kernel|_depth_attention_kernel' \
  --launch-skip 20 --launch-count 5 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats \
  python3 scripts/gpu_ncu_mlp.py > "$OUT/ncu.txt" 2>&1
echo "=== ncu exited $?"
grep -E "^  _|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit Registers|Waves Per SM|Stall Long|Warp Cycles Per Issued|L2 Hit Rate|One or More Eligible|Grid Size|Block Size" "$OUT/ncu.txt" | head -n 120
