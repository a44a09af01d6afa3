# Sourced by the one-call device scripts (gpu_mlp_loop.sh, gpu_rows_mlp.sh, gpu_sampling_split.sh): $OUT
# created, the repository's packages and scripts/ on PYTHONPATH, the card and its clocks printed first.
set -u
OUT="${OUT:-results/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="worker:client:protos:scripts${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
