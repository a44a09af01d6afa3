#!/usr/bin/env bash
# Quick start on a fresh machine: install what is missing, start the worker on the tiny embedded default,
# synthesize a sentence with `breeze-client synth --stream`, fetch its artifact, stop the worker.
# The tiny default has random weights: its audio is NOT speech (pass --model DIR for the real model).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
out="${QUICKSTART_DIR:-$(mktemp -d)}"
mkdir -p "$out"

echo "== starting the worker (logs: $out/worker.log)"
# --artifact-grace-s: a worker that stops keeps serving artifacts that long for clients still fetching (10 s
# by default, for production); the quick start has fetched its artifact by then, so it stops at once
breeze-worker serve --device cpu --port 0 --artifact-port 0 --artifact-dir "$out/artifacts" \
  --artifact-grace-s 0 >"$out/worker.out" 2>"$out/worker.log" &
worker=$!
trap 'kill -TERM $worker 2>/dev/null || true; wait $worker 2>/dev/null || true' EXIT
for _ in $(seq 1200); do
  grep -q "breeze-worker ready" "$out/worker.out" && break
  kill -0 "$worker" 2>/dev/null || { echo "the worker exited:"; tail -20 "$out/worker.log"; exit 1; }
  sleep 0.25
done
ready=$(grep "breeze-worker ready" "$out/worker.out") || { echo "the worker did not get ready"; exit 1; }
echo "$ready"
target=$(sed -E 's/.*synthesis=([^ ]+).*/\1/' <<<"$ready")
artifact_target=$(sed -E 's/.*artifacts=([^ ]+).*/\1/' <<<"$ready")

echo "== breeze-client synth --stream"
breeze-client synth "Hello from the Breeze TTS worker." --stream -o "$out/hello.wav" --max-frames 25 \
  --target "$target" | tee "$out/synth.txt"
artifact=$(awk '$1 == "artifact" {print $2}' "$out/synth.txt")

echo "== breeze-client fetch $artifact"
breeze-client fetch "$artifact" -o "$out/fetched.wav" --target "$target" --artifact-target "$artifact_target"
cmp <(tail -c +45 "$out/hello.wav") <(tail -c +45 "$out/fetched.wav") \
  || { echo "quickstart: the streamed audio and the fetched artifact differ" >&2; exit 1; }
echo "== the streamed audio and the fetched artifact are identical"

echo "== stopping the worker"
kill -TERM "$worker"
wait "$worker"
trap - EXIT
echo "== done: $out/hello.wav (streamed), $out/fetched.wav (artifact)"
