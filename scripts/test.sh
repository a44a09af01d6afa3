#!/usr/bin/env bash
# Install what the tests need (.venv with CPU torch, the project and its dev tools), then run the tests.
# Usage: scripts/test.sh [pytest arguments]        (.ci/run calls this from a clean clone)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh --dev
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -q "$@"
