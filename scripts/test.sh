#!/usr/bin/env bash
# Install what the tests need (.venv with CPU torch, the project and its dev tools), then run the tests.
# Usage: scripts/test.sh [pytest arguments]        (.ci/run calls this from a clean clone)
# Without root, or without a system tool below (and no root to install it), every other test runs; the
# skipped ones are listed at the end with what each needs. BREEZE_TESTS_REQUIRE_HOST=1 (set by .ci/run)
# makes a missing tool or missing root an error instead: CI runs every test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# system tools the tests use: espeak-ng + sox (real speech), iproute2 (network namespaces, tc),
# chromium (renders the diagnosis report), openssl (TLS test certificates), node + npm (a stock grpc-js
# client: the tests run `npm ci` in tests/interop/node), mount + e2fsprogs (a loop-mounted ext4 volume that a
# cgroup I/O limit throttles, in the retrieval-fault tests), unshare (a private /etc/hosts naming a fleet),
# curl (the README's HTTP example)
missing=()
for pair in espeak-ng:espeak-ng sox:sox ip:iproute2 tc:iproute2 chromium:chromium openssl:openssl node:nodejs \
            npm:npm losetup:mount mkfs.ext4:e2fsprogs unshare:util-linux mount:mount curl:curl; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair##*:}")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "test: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
  elif [[ ${BREEZE_TESTS_REQUIRE_HOST:-} == 1 ]]; then
    echo "test: missing system tools: ${missing[*]}; BREEZE_TESTS_REQUIRE_HOST=1 (CI) requires every one:" \
         "install them, or run as root on Debian/Ubuntu" >&2
    exit 1
  else
    echo "test: missing system tools: ${missing[*]}: the tests that need them are skipped and listed at the" \
         "end (install them, or run this as root on Debian/Ubuntu, to run those too)" >&2
  fi
fi
if [[ $(id -u) -ne 0 && ${BREEZE_TESTS_REQUIRE_HOST:-} != 1 ]]; then
  echo "test: not root: the tests that need root (network namespaces, mounts, cgroups) are skipped and" \
       "listed at the end" >&2
fi
bash scripts/install.sh --dev
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# in parallel: each test file runs whole in one of BREEZE_TEST_WORKERS processes, the longest files first and
# the heaviest fault suites one after another (tests/run_layout.py); BREEZE_TEST_WORKERS=0: in this process
exec .venv/bin/python -m pytest -q -n "${BREEZE_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
