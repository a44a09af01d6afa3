#!/usr/bin/env bash
# Set up .venv for this checkout (idempotent): Python >= 3.11, CPU torch 2.13.0 first, then the project.
# Usage: scripts/install.sh [--dev]     (--dev adds the test tools: pytest, grpcio-tools, import-linter)
# torch is installed before the project so pip never pulls a multi-GB CUDA build; it comes from the local
# wheel directory when one is configured, otherwise from the configured index (on a machine without local
# wheels, set BREEZE_TORCH_INDEX=https://download.pytorch.org/whl/cpu to avoid a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extra=""
[[ "${1:-}" == "--dev" ]] && extra="[dev]"

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  for candidate in python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null; then python="$candidate"; break; fi
  done
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "install: Python >= 3.11 is needed (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

[[ -x .venv/bin/python ]] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet)

if ! .venv/bin/python -c 'import torch, sys; sys.exit(not torch.__version__.startswith("2.13.0"))' 2>/dev/null; then
  echo "install: torch 2.13.0 (CPU build)"
  if [[ -n "${BREEZE_TORCH_INDEX:-}" ]]; then
    "${pip[@]}" torch==2.13.0 --index-url "$BREEZE_TORCH_INDEX"
  else
    # a local wheel directory (pip's find-links) first; else the package index pip is configured with
    "${pip[@]}" --no-index torch==2.13.0 2>/dev/null || "${pip[@]}" torch==2.13.0
  fi
fi

# the project (editable); re-run only when pyproject.toml changed since the last install
stamp=".venv/.breeze-installed${extra}"
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
  echo "install: breeze-tts-serving${extra}"
  "${pip[@]}" -e ".${extra}"
  touch "$stamp"
fi
