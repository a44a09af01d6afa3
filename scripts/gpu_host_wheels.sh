#!/usr/bin/env bash
# The wheels a GPU host's own image may lack, downloaded here for an offline install there (its torch,
# Triton and transformers stay). The versions are the ones this checkout's .venv tests with (py-spy: the
# latest), for CPython PYVER on manylinux x86_64. Prints one JSON object: the folder, the Python version and
# the wheels in the folder.
#   scripts/gpu_host_wheels.sh [DIR] [PYVER]          default: .whl 3.12
# On the GPU host, before the benchmark:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl
#   export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
  exit 0
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir="${1:-.whl}"
pyver="${2:-3.12}"
[[ -x .venv/bin/python ]] || { echo "gpu_host_wheels: no .venv here: run scripts/install.sh --dev first" >&2; exit 1; }
# the worker's and the client's modules outside torch/transformers, with what they load (cffi for soundfile)
packages=(grpcio grpcio-health-checking grpcio-reflection protobuf prometheus-client zstandard soundfile soxr
          cffi pycparser
          aiohttp multidict yarl propcache frozenlist aiosignal aiohappyeyeballs attrs idna)  # the HTTP face
specs=()
for name in "${packages[@]}"; do
  version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  specs+=("$name==$version")
done
specs+=(py-spy)  # the serve bench's --profile-levels
mkdir -p "$dir"
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "$pyver" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$dir" "${specs[@]}" >&2
.venv/bin/python -c 'import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
print(json.dumps({"dir": str(d.resolve()), "python": sys.argv[2], "wheels": sorted(p.name for p in d.glob("*.whl"))}))
' "$dir" "$pyver"
