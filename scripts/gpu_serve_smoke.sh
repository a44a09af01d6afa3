#!/usr/bin/env bash
# GPU smoke test of the whole product: `breeze-worker serve --device cuda` on the tiny embedded default
# (fast path, batched stepper, CUDA graphs), then `breeze-client synth --stream` (plain and CFG), a fetch,
# and a 4-client bench. Carries its missing wheels in .whl (see the device README). Writes logs under $OUT;
# READY_S: seconds to wait for the worker to be ready (default 120).
set -u
OUT="${OUT:-/tmp/serve_smoke}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}worker:client:protos" PYTHONUNBUFFERED=1
python3 -m breeze_worker.cli serve --device "${SMOKE_DEVICE:-cuda}" --port 0 --artifact-port 0 --artifact-dir /tmp/breeze-art \
  > "$OUT/serve.log" 2>&1 &
worker=$!
for _ in $(seq 1 $((2 * ${READY_S:-120}))); do grep -q "breeze-worker ready" "$OUT/serve.log" && break; sleep 0.5; done
line=$(grep "breeze-worker ready" "$OUT/serve.log") || { echo "worker never became ready"; tail -40 "$OUT/serve.log"; exit 1; }
echo "$line"
target=$(sed -E 's/.*synthesis=([^ ]+).*/\1/' <<<"$line")
client=(python3 -m breeze_client.cli)
status=0
run() { echo "+ $*" >&2; "$@" || { status=1; echo "!!! exit $?"; }; }
run "${client[@]}" synth "Hello from the GPU." --stream -o "$OUT/plain.wav" --seed 7 --target "$target" --json \
  | tee "$OUT/plain.json"
run "${client[@]}" synth "Softly now." --instruction "Whisper." --cfg-scale 1.5 --seed 7 --stream \
  -o "$OUT/cfg.wav" --target "$target" --json | tee "$OUT/cfg.json"
artifact=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("artifact_id") or d["artifact"]["artifact_id"])' "$OUT/plain.json" 2>/dev/null)
[ -n "$artifact" ] && run "${client[@]}" fetch "$artifact" -o "$OUT/fetched.wav" --target "$target"
run "${client[@]}" bench --labels short,chunk-4.80s --frames 24 --iterations 2 --concurrency 4 --target "$target"
kill -TERM $worker; wait $worker; echo "worker exit $?"
tail -25 "$OUT/serve.log"
exit $status
