#!/usr/bin/env bash
# Set up .venv for this checkout (idempotent): Python >= 3.11, the CPU build of torch first, then the project,
# both at the versions constraints/cpu.txt pins.
# Usage: scripts/install.sh [--dev | --client]
#   (none)    the worker and the client: pip install -e ".[worker]"
#   --dev     also the test tools (pytest, grpcio-tools, import-linter): pip install -e ".[worker,dev]"
#   --client  the client alone (SDK, breeze-client; no torch): pip install -e .
# torch is installed before the project so pip never pulls a multi-GB CUDA build: from a local wheel
# directory when pip is configured with one (--no-index first), otherwise from the package index pip is
# configured with. BREEZE_TORCH_INDEX=URL installs torch from that index instead (for example
# https://download.pytorch.org/whl/cpu on a machine without local wheels whose default index would serve
# a CUDA build); it is never used unless you set it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case "${1:-}" in
  "") extra="[worker]" ;;
  --dev) extra="[worker,dev]" ;;
  --client) extra="" ;;
  *) echo "install: unknown option $1 (use --dev or --client)" >&2; exit 2 ;;
esac

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  for candidate in python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null; then python="$candidate"; break; fi
  done
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "install: Python >= 3.11 is needed (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

# `python -m venv` needs ensurepip (Debian/Ubuntu ship it separately, in python3-venv / python3.X-venv)
if ! "$python" -c 'import ensurepip' 2>/dev/null; then
  version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "install: python${version}-venv (ensurepip is missing)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "python${version}-venv" \
      >/dev/null 2>&1 \
      || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  "$python" -c 'import ensurepip' 2>/dev/null || {
    echo "install: $python cannot create a virtual environment (no ensurepip): install python${version}-venv" \
         "(Debian/Ubuntu: sudo apt-get install python${version}-venv) and run this again" >&2
    exit 1
  }
fi

# a .venv left half-made by an earlier failed run (python but no pip) is rebuilt, not reused
if [[ -e .venv ]] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  echo "install: .venv is incomplete (no working pip); rebuilding it"
  rm -rf .venv
fi
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet)

constraints=constraints/cpu.txt
torch_pin="$(grep -E '^torch==' "$constraints")"
if [[ -n "$extra" ]] && ! .venv/bin/python -c \
     'import sys, torch; sys.exit(torch.__version__.split("+")[0] != sys.argv[1])' "${torch_pin#torch==}" 2>/dev/null
then
  echo "install: $torch_pin (CPU build)"
  if [[ -n "${BREEZE_TORCH_INDEX:-}" ]]; then
    "${pip[@]}" -c "$constraints" torch --index-url "$BREEZE_TORCH_INDEX"
  else
    # a local wheel directory (pip's find-links) first; else the package index pip is configured with
    "${pip[@]}" --no-index -c "$constraints" torch 2>/dev/null || "${pip[@]}" -c "$constraints" torch
  fi
fi

# the project (editable); re-run only when pyproject.toml or the constraints changed since the last install of
# these extras or of more (a .venv installed --dev, as scripts/test.sh does, holds the worker and the client)
fresh() { [[ -f ".venv/.breeze-installed$1" && ! pyproject.toml -nt ".venv/.breeze-installed$1" \
             && ! "$constraints" -nt ".venv/.breeze-installed$1" ]]; }
stamp=".venv/.breeze-installed${extra:-[client]}"
case "${extra:-[client]}" in
  "[client]") covered=("[client]" "[worker]" "[worker,dev]") ;;
  "[worker]") covered=("[worker]" "[worker,dev]") ;;
  *) covered=("$extra") ;;
esac
installed=""
for have in "${covered[@]}"; do fresh "$have" && installed="$have" && break; done
if [[ -z "$installed" ]]; then
  echo "install: breeze-tts-serving${extra}"
  "${pip[@]}" -c "$constraints" -e ".${extra}"
  touch "$stamp"
fi
