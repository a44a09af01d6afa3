#!/usr/bin/env bash
# Install what the tests need (.venv with CPU torch, the project and its dev tools), then run the tests.
# Usage: scripts/test.sh [pytest arguments]        (.ci/run calls this from a clean clone)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# system tools the tests use: espeak-ng + sox (real speech), iproute2 (network namespaces, tc),
# chromium (renders the diagnosis report), openssl (TLS test certificates), node + npm (a stock grpc-js
# client: the tests run `npm ci` in tests/interop/node), mount + e2fsprogs (a loop-mounted ext4 volume that a
# cgroup I/O limit throttles, in the retrieval-fault tests), unshare (a private /etc/hosts naming a fleet)
missing=()
for pair in espeak-ng:espeak-ng sox:sox ip:iproute2 tc:iproute2 chromium:chromium openssl:openssl node:nodejs \
            npm:npm losetup:mount mkfs.ext4:e2fsprogs unshare:util-linux mount:mount; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair##*:}")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "test: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
  else
    echo "test: missing system tools: ${missing[*]} (install them, or run as root on Debian/Ubuntu)" >&2
    exit 1
  fi
fi
bash scripts/install.sh --dev
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -q "$@"
