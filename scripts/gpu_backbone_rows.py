"""GPU timing of the backbone layer step in the `gemm` form (the batched engine above 2 rows) at many rows:
the whole layer as one compiled function (`decode_layer`, the cache write a scatter inside it, which
Inductor turned into a copy of the cache slice and back: batching runs 7-9's profile, ~12 us each per
layer at 48 rows) against the same layer as the three compiled units with the write an in-place scatter
between them (`PackedLayer.decode_units`, form "gemm", as the depth decoder's and the units forms'
backbone layers run). Both in CUDA graphs of the layers, full-size backbone, seeded random weights, BF16,
each row at its own slot over 256 slots; outputs and written caches compared.

    BREEZE_COMMIT=<sha> PYTHONPATH=worker:scripts python3 scripts/gpu_backbone_rows.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import gpu_backbone
import gpu_fused
from breeze_worker.engine.fastpath.compiled import compile_unit
from breeze_worker.engine.fastpath.layers import UNITS, decode_layer


def run_whole(bb, x, cos, sin, slots, mask, caches, fn):
    for layer, (k, v) in zip(bb.layers, caches):
        x = layer.decode(x, cos, sin, k, v, slots, mask, fn=fn)
    return x


def run_units(bb, x, cos, sin, slots, mask, caches, units):
    for layer, (k, v) in zip(bb.layers, caches):
        x = layer.decode_units(x, cos, sin, k, v, slots, mask, units=units, form="gemm")
    return x


@torch.no_grad()
def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--rows", default="16,48")
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    result = gpu_fused.gpu_result()
    bb = gpu_backbone.Backbone(torch.bfloat16, layers=args.layers)
    whole, units = compile_unit(decode_layer), tuple(compile_unit(fn) for fn in UNITS)
    result["steps"] = []
    ok = True
    for rows in (int(r) for r in args.rows.split(",")):
        x, cos, sin, slots, mask, stale = bb.inputs(rows, seed=rows)
        row = {"rows": rows, "slots": gpu_backbone.SLOTS, "layers": args.layers}
        outs = {}
        for name, run, fn in (("whole", run_whole, whole), ("units", run_units, units)):
            caches = [(k.clone(), v.clone()) for k, v in stale]
            t0 = time.perf_counter()
            y = run(bb, x, cos, sin, slots, mask, caches, fn)  # compiles outside the graph
            torch.cuda.synchronize()
            row[f"{name}_first_s"] = time.perf_counter() - t0
            outs[name] = (y.float(), torch.cat([torch.cat([k.flatten(), v.flatten()]) for k, v in caches]).float())
            row[f"{name}_us"] = gpu_fused.graph_ms(lambda: run(bb, x, cos, sin, slots, mask, caches, fn)) * 1000 \
                / args.layers
        row["out_rel"] = gpu_fused.rel(outs["units"][0], outs["whole"][0])
        row["cache_rel"] = gpu_fused.rel(outs["units"][1], outs["whole"][1])
        row["ok"] = bool(torch.isfinite(outs["units"][0]).all()) and row["out_rel"] < 3e-2 and row["cache_rel"] < 3e-2
        ok = ok and row["ok"]
        print(json.dumps(row), flush=True)
        result["steps"].append(row)
    result["checks_ok"] = ok
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
