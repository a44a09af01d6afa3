"""GPU check and timing of the fast path's Triton GEMV (engine/fastpath/gemv.py) at the full-size model's
projection shapes: relative error against an FP64 reference, and median time against the GEMM library
(F.linear) and the weight's byte floor at the measured copy bandwidth. Prints a table; --json writes it.

    PYTHONPATH=worker python3 scripts/gpu_gemv_check.py --json out.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from breeze_worker.bench.measure import copy_bandwidth
from breeze_worker.engine.fastpath import gemv

SHAPES = {  # name: (N, K) of the full-size model's projections
    "backbone qkv": (4096, 2048), "backbone o": (2048, 2048), "backbone gate_up": (12288, 2048),
    "backbone down": (2048, 6144), "depth qkv": (1536, 1024), "depth o": (1024, 1024),
    "depth gate_up": (16384, 1024), "depth down": (1024, 8192),
}


def bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--rows", default="1,2,4,8")
    args = parser.parse_args()
    assert gemv.available(torch.device("cuda")), "Triton GEMV not available"
    bandwidth = copy_bandwidth(torch.device("cuda"))
    out = {"gpu": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": bandwidth, "rows": []}
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(f"{'shape':18} {'R':>2} {'dtype':>9} {'rel err':>9} {'triton us':>9} {'F.linear':>9} {'floor us':>8} {'x floor':>7}")
    worst = 0.0
    for rows in [int(r) for r in args.rows.split(",")]:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for name, (n, k) in SHAPES.items():
                if dtype == torch.float32 and rows != 2:
                    continue
                # several weights in rotation so repeated runs do not measure the L2 cache
                weights = [torch.randn(n, k, device="cuda").to(dtype) for _ in range(4)]
                x = torch.randn(rows, k, device="cuda").to(dtype)
                ref = x.double() @ weights[0].double().T
                got = gemv.small_linear(x.float(), weights[0]).double()
                err = ((got - ref).norm() / ref.norm()).item()
                worst = max(worst, err if dtype != torch.float32 else 0.0)
                it = iter(range(10**9))
                t_triton = bench(lambda: gemv.gemv(x, weights[next(it) % 4]))
                t_lib = bench(lambda: F.linear(x, weights[next(it) % 4]))
                floor_us = n * k * weights[0].element_size() / bandwidth * 1e6
                row = {"shape": name, "rows": rows, "dtype": str(dtype).replace("torch.", ""), "rel_err": err,
                       "triton_us": 1000 * t_triton, "linear_us": 1000 * t_lib, "floor_us": floor_us,
                       "splits": gemv.plan(rows, n, k)[0]}
                out["rows"].append(row)
                print(f"{name:18} {rows:>2} {row['dtype']:>9} {err:9.2e} {row['triton_us']:9.2f} {row['linear_us']:9.2f} "
                      f"{floor_us:8.2f} {row['triton_us'] / floor_us:7.2f}")
    ok = worst < 1e-2 and all(r["rel_err"] < 1e-5 for r in out["rows"] if r["dtype"] == "float32")
    out["ok"] = ok
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print("errors within bounds" if ok else "ERROR: relative error out of bounds")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
