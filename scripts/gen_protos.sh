#!/usr/bin/env bash
# Regenerate the Python stubs of the gRPC contract from protos/breeze_tts_proto/v1/*.proto.
# Usage: scripts/gen_protos.sh [OUT_DIR]   (default: protos/, i.e. next to the .proto files)
# Needs grpcio-tools 1.85.1 (pip install -e .[dev]); the stubs import as breeze_tts_proto.v1.<name>_pb2.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/protos}"
python="${PYTHON:-python}"
cd "$root/protos"
mkdir -p "$out"
"$python" -m grpc_tools.protoc --proto_path=. \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  breeze_tts_proto/v1/*.proto
