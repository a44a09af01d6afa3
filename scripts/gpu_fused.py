"""GPU check and timing of the fused depth layer (engine/fastpath/fused.py) at the full-size depth decoder's
shapes (hidden 1024, 8 heads / 2 KV heads of 128, MLP 8192, 16 slots), 12 layers of seeded random weights.

1. correctness: the depth layer as the kernels (fused.depth_layer, the `fused+chain+all` form's) vs the same
   stages in torch (FP32 and BF16), and vs the units+attn form (PackedLayer.decode_units, uncompiled); the
   kernels' output is bit-identical over repeated runs (the split-K sum is ordered) and with and without
   chained launches (programmatic dependent launch, `fused.pdl`).
2. launch settings: each kernel alone over the 12 layers in one CUDA graph, per candidate setting; the
   fastest (the default wins ties within 2%) is written to --best-out as BREEZE_FUSED_CONFIG JSON.
3. the layer step: the kernels (chained, unchained, best settings) vs units+attn and the library GEMM units
   compiled by Inductor, per layer step, in CUDA graphs of the 12 layers, at 2 rows x 1 position (batch 1
   with CFG) and 2 x 2 (the depth prefill).

    BREEZE_COMMIT=<sha> PYTHONPATH=worker python3 scripts/gpu_fused.py --json out.json --best-out best.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch

from breeze_worker.bench.measure import copy_bandwidth
from breeze_worker.engine.fastpath import fused
from breeze_worker.engine.fastpath.compiled import compile_unit
from breeze_worker.engine.fastpath.layers import PLAIN_UNITS, LayerUnits, PackedLayer
from breeze_worker.engine.fastpath.settings import FastPathSettings
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.lm.depth_decoder import llama_layer
from breeze_worker.model.lm.rope import RotaryEmbedding

SLOTS = 16
DEVICE = "cuda"  # --dry-run: "cpu" (the kernels in Triton's interpreter; correctness only, 2 layers)
CANDIDATES = {
    "qkv_rope": [{"block_p": p, "num_warps": w} for p in (1, 2, 4) for w in (2, 4, 8)],
    "norm_gate_up": [{"block_n": n, "num_warps": w} for n in (1, 2, 4) for w in (2, 4, 8)]
    + [{"block_n": n, "num_warps": 2, "evict": True} for n in (2, 4)],
    "down_residual": [{"block_n": n, "chunk": c, "num_warps": w} for n, c in ((1, 2048), (2, 2048), (4, 2048),
                                                                              (2, 1024), (4, 1024), (8, 1024),
                                                                              (4, 512), (8, 512))
                      for w in (4, 8)]
    + [{"block_n": n, "chunk": 2048, "num_warps": 4, "evict": True} for n in (2, 4)],
    "o_residual": [{"block_n": n, "chunk": c, "num_warps": w} for n, c in ((1, 1024), (2, 1024), (4, 1024),
                                                                           (2, 512), (4, 512), (8, 512))
                   for w in (2, 4)],
}


def seeded_layers(build, cfg, count: int, dtype: torch.dtype, seed: int) -> list[PackedLayer]:
    """`count` layers `build(cfg, i)` with seeded random weights (norm gains near 1), packed, on DEVICE."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    layers = []
    with torch.device(DEVICE), torch.no_grad():
        for i in range(count):
            layer = build(cfg, i)
            for name, p in layer.named_parameters():
                noise = torch.randn(p.shape, generator=gen, device=DEVICE)
                p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.02 * noise)
            layers.append(PackedLayer(layer.to(dtype)))
    return layers


class Depth:
    """12 full-size depth layers (packed), their RoPE tables and a cache per layer."""

    def __init__(self, dtype: torch.dtype, seed: int = 0, layers: int = 12, size: str = "full"):
        cfg = (BreezeConfig.full_size() if size == "full" else BreezeConfig.tiny()).depth
        self.cfg = cfg
        self.layers = seeded_layers(llama_layer, cfg, layers, dtype, seed)
        with torch.device(DEVICE), torch.no_grad():
            rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
            self.cos, self.sin = rotary(torch.arange(SLOTS), dtype)  # [16, D]
        self.dtype = dtype

    def caches(self, rows: int, seed: int):
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        shape = (rows, self.cfg.num_key_value_heads, SLOTS, self.cfg.head_dim)
        return [(torch.randn(shape, generator=gen, device=DEVICE).to(self.dtype),
                 torch.randn(shape, generator=gen, device=DEVICE).to(self.dtype)) for _ in self.layers]

    def inputs(self, start: int, t: int):
        """cos/sin [T, D] for the fused kernels; [1, 1, T, D] tables, slots and additive mask for the units."""
        cos, sin = self.cos[start:start + t].contiguous(), self.sin[start:start + t].contiguous()
        query = torch.arange(start, start + t, device=DEVICE)[:, None]
        allowed = torch.arange(SLOTS, device=DEVICE)[None, :] <= query
        mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None].contiguous()
        slots = torch.arange(start, start + t, device=DEVICE)[None].contiguous()
        return cos, sin, cos[None, None].clone(), sin[None, None].clone(), slots, mask


def run_fused(depth: Depth, x, start, caches, workspace, ks: fused.KernelSettings = fused.DEFAULT_KERNELS):
    t = x.shape[1]
    cos, sin, _, _, _, mask = depth.inputs(start, t)
    for layer, (k, v) in zip(depth.layers, caches):
        x = fused.depth_layer(layer, x, cos, sin, k, v, start, mask, workspace, ks)
    return x


def run_units(depth: Depth, x, start, caches, units: LayerUnits = PLAIN_UNITS, small_rows: bool = True):
    """The depth layers as units: FP32 reductions (units+attn) or library GEMMs (`small_rows` False)."""
    _, _, cos4, sin4, slots, mask = depth.inputs(start, x.shape[1])
    for layer, (k, v) in zip(depth.layers, caches):
        x = layer.decode_units(x, cos4, sin4, k, v, slots, mask, units, small_rows=small_rows, static_slot=start)
    return x


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


@torch.no_grad()
def check(depth: Depth, rows: int, t: int, start: int) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(rows * 100 + t)
    x = torch.randn(rows, t, depth.cfg.hidden_size, generator=gen, device=DEVICE).to(depth.dtype)
    stale = depth.caches(rows, seed=7)
    results = {}
    settings = {"kernel": fused.DEFAULT_KERNELS, "kernel-again": fused.DEFAULT_KERNELS,
                "torch": fused.KernelSettings(use_triton=False), "unchained": fused.KernelSettings(chained=False)}
    for mode in ("kernel", "kernel-again", "torch", "units", "unchained"):
        caches = [(k.clone(), v.clone()) for k, v in stale]
        if mode == "units":
            y = run_units(depth, x, start, caches)
        else:
            y = run_fused(depth, x, start, caches, fused.DownWorkspace(), settings[mode])
        written = torch.cat([torch.cat([k[:, :, start:start + t], v[:, :, start:start + t]]) for k, v in caches])
        results[mode] = (y, written)
    out = {"rows": rows, "t": t, "start": start, "dtype": str(depth.dtype).replace("torch.", "")}
    out["vs_torch_out"] = rel(results["kernel"][0], results["torch"][0])
    out["vs_torch_cache"] = rel(results["kernel"][1], results["torch"][1])
    out["vs_units_out"] = rel(results["kernel"][0], results["units"][0])
    out["torch_vs_units_out"] = rel(results["torch"][0], results["units"][0])
    out["pdl"] = fused.pdl(torch.device(DEVICE))
    out["chain_pdl_identical"] = bool(torch.equal(results["kernel"][0], results["unchained"][0])
                                      and torch.equal(results["kernel"][1], results["unchained"][1]))
    out["repeat_identical"] = bool(torch.equal(results["kernel"][0], results["kernel-again"][0]))
    out["finite"] = bool(torch.isfinite(results["kernel"][0]).all())
    bound = 1e-5 if depth.dtype == torch.float32 else 2e-2
    out["ok"] = (out["finite"] and out["repeat_identical"] and out["vs_torch_out"] <= bound
                 and out["vs_torch_cache"] <= bound and out["vs_units_out"] <= max(bound, 2 * out["torch_vs_units_out"])
                 and out["chain_pdl_identical"])
    return out


def wall_us(fn, replays: int = 1) -> float:
    """Wall-clock us per `fn()` without graphs: the scripts' --dry-run stand-in for graph_ms (CPU)."""
    t0 = time.perf_counter()
    for _ in range(replays):
        fn()
    return (time.perf_counter() - t0) * 1e6 / replays


def graph_ms(fn, reps: int = 10, iters: int = 7) -> float:
    """Median time of one `fn()` replayed from a CUDA graph of `reps` calls (ms)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


@torch.no_grad()
def kernel_inputs(depth: Depth, rows: int, t: int, start: int):
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    hidden_size = depth.cfg.hidden_size
    x = torch.randn(rows, t, hidden_size, generator=gen, device=DEVICE).to(depth.dtype)
    caches = depth.caches(rows, seed=5)
    cos, sin = depth.cos[start:start + t].contiguous(), depth.sin[start:start + t].contiguous()
    hidden = torch.randn(rows, t, depth.cfg.intermediate_size, generator=gen, device=DEVICE).to(depth.dtype)
    attn = torch.randn(rows, t, depth.cfg.hidden_size, generator=gen, device=DEVICE).to(depth.dtype)
    workspace = fused.DownWorkspace()
    calls = {  # each takes the launch settings (fused.KernelSettings) to time
        "qkv_rope": lambda ks: [fused.qkv_rope(x, l.w_in, l.eps_in, l.qkv, cos, sin, k, v, start, heads=l.heads,
                                               kv_heads=l.kv_heads, head_dim=l.head_dim, kernels=ks)
                                for l, (k, v) in zip(depth.layers, caches)],
        "norm_gate_up": lambda ks: [fused.norm_gate_up(x, l.w_post, l.eps_post, l.gate_up, l.intermediate, ks)
                                    for l in depth.layers],
        "down_residual": lambda ks: [fused.down_residual(hidden, l.mlp.down_proj.weight, x, workspace, kernels=ks)
                                     for l in depth.layers],
        "o_residual": lambda ks: [fused.down_residual(attn, l.attn.o_proj.weight, x, workspace, kernel="o_residual",
                                                      kernels=ks) for l in depth.layers],
    }
    return calls


def weight_bytes(layer: PackedLayer) -> dict:
    size = layer.qkv.element_size()
    return {"qkv_rope": layer.qkv.numel() * size, "norm_gate_up": layer.gate_up.numel() * size,
            "down_residual": layer.mlp.down_proj.weight.numel() * size,
            "o_residual": layer.attn.o_proj.weight.numel() * size}


@torch.no_grad()
def tune(depth: Depth, bandwidth: float, rows: int = 2, t: int = 1, start: int = 5) -> tuple[dict, dict]:
    calls = kernel_inputs(depth, rows, t, start)
    n_layers = len(depth.layers)
    floors = {k: b / bandwidth * 1e6 for k, b in weight_bytes(depth.layers[0]).items()}
    widths = {kernel: depth.cfg.intermediate_size if kernel == "down_residual" else 1024 for kernel in CANDIDATES}
    # (each kernel's calls chain to each other here when the device has `fused.pdl`)
    return time_candidates(CANDIDATES, calls, floors, widths, n_layers)


def time_candidates(candidates: dict, calls: dict, floors: dict, widths: dict, n_layers: int) -> tuple[dict, dict]:
    """Each kernel's `calls[kernel](ks)` (one call per layer) in a CUDA graph per candidate launch setting: us per
    call, x its byte floor. The fastest is chosen unless the committed plan (`fused.plan` at `widths[kernel]`)
    is within 2% of it. Returns (table, best settings per kernel)."""
    table, best = {}, {}
    for kernel, settings in candidates.items():
        default = fused.plan(kernel, widths[kernel])
        rows_out = []
        for cfg in settings:
            ks = fused.KernelSettings(plans={kernel: cfg})
            try:
                us = graph_ms(lambda: calls[kernel](ks)) * 1000 / n_layers
            except Exception as exc:  # a setting the compiler rejects (registers, shapes): skip it
                rows_out.append({"config": cfg, "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            rows_out.append({"config": cfg, "us": us, "x_floor": us / floors[kernel]})
            print(f"{kernel:14} {json.dumps(cfg):62} {us:7.2f} us  ({us / floors[kernel]:.2f}x floor "
                  f"{floors[kernel]:.2f} us)", flush=True)
        timed = [r for r in rows_out if "us" in r]
        default_us = graph_ms(lambda: calls[kernel](fused.DEFAULT_KERNELS)) * 1000 / n_layers  # the committed plan
        fastest = min(timed, key=lambda r: r["us"]) if timed else {"config": default, "us": default_us}
        chosen = {"config": default, "us": default_us} if default_us <= 1.02 * fastest["us"] else fastest
        best[kernel] = chosen["config"]
        table[kernel] = {"floor_us": floors[kernel], "default": default, "default_us": default_us,
                         "candidates": rows_out, "chosen": chosen["config"], "chosen_us": chosen["us"]}
    return table, best


@torch.no_grad()
def layer_steps(depth: Depth, best: dict) -> list[dict]:
    out = []
    compiled = LayerUnits.wrapped(lambda fn: compile_unit(fn, FastPathSettings()))
    for rows, t, start in ((2, 1, 5), (2, 2, 0)):
        gen = torch.Generator(device=DEVICE).manual_seed(11)
        x = torch.randn(rows, t, depth.cfg.hidden_size, generator=gen, device=DEVICE).to(depth.dtype)
        caches = depth.caches(rows, seed=9)
        workspace = fused.DownWorkspace()
        row = {"rows": rows, "t": t}
        n = len(depth.layers)
        # the kernels with and without programmatic dependent launch, default and best launch settings
        for key, ks in (("fused+chain", fused.DEFAULT_KERNELS),
                        ("fused+chain_unchained", fused.KernelSettings(chained=False)),
                        ("fused+chain_best", fused.KernelSettings(plans=best))):
            row[f"{key}_us"] = graph_ms(lambda: run_fused(depth, x, start, caches, workspace, ks)) * 1000 / n
        row["pdl"] = fused.pdl(torch.device(DEVICE))
        for name, small_rows in (("units+attn", True), ("gemm", False)):
            t0 = time.perf_counter()
            run_units(depth, x, start, caches, compiled, small_rows)  # compile outside the graph
            row[f"{name}_compile_s"] = time.perf_counter() - t0
            row[f"{name}_us"] = graph_ms(lambda: run_units(depth, x, start, caches, compiled, small_rows)) * 1000 / n
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def gpu_result(device: str = "cuda") -> dict:
    """The JSON skeleton of a GPU run: meta (GPU, date, commit, versions, SMs, chained launches) and the measured
    copy bandwidth. On the CPU (the scripts' dry runs) the GPU is "cpu (dry run)" and the bandwidth None."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    bandwidth = copy_bandwidth(dev)
    result = {"meta": {"gpu": torch.cuda.get_device_name() if cuda else "cpu (dry run)",
                       "date": datetime.datetime.now(datetime.UTC).isoformat(),
                       "commit": os.environ.get("BREEZE_COMMIT", "unknown"), "torch": torch.__version__,
                       "triton": fused._triton.__version__ if fused._triton else None,
                       "multiprocessors": torch.cuda.get_device_properties(dev).multi_processor_count if cuda else None,
                       "pdl": fused.pdl(dev)},
              "copy_bandwidth_bytes_per_s": bandwidth}
    shown = f"{bandwidth / 1e12:.2f} TB/s" if bandwidth else "not measured"
    print(f"{result['meta']}  copy bandwidth {shown}", flush=True)
    return result


def tune_then_time(result: dict, args, tune_fn, steps_fn, what: str) -> int:
    """Parts 2-3 after the checks: launch settings (unless --skip-tune; written to --best-out only when the
    checks passed), then the layer steps with them; the JSON to --json. Exit status: the checks'."""
    best = {}
    if not args.skip_tune:
        result["tune"], best = tune_fn()
        result["best"] = best
        print("best:", json.dumps(best), flush=True)
    if args.best_out:
        with open(args.best_out, "w") as fh:
            json.dump(best if result["checks_ok"] else {}, fh)
    result["layer_steps"] = steps_fn(best)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    print("checks ok" if result["checks_ok"] else f"ERROR: a {what} check failed", flush=True)
    return 0 if result["checks_ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--best-out", default=None)
    parser.add_argument("--skip-tune", action="store_true")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, TRITON_INTERPRET=1: the checks on the tiny config's depth layers")
    args = parser.parse_args()
    if args.dry_run:
        global DEVICE
        DEVICE = "cpu"
        for dtype in (torch.float32, torch.bfloat16):
            depth = Depth(dtype, layers=2, size="tiny")
            for rows, t, start in ((2, 1, 9), (2, 2, 0)):
                print(json.dumps(check(depth, rows, t, start)), flush=True)
        return 0
    assert fused.available(torch.device("cuda")), "Triton kernels not available"
    result = gpu_result()
    bandwidth = result["copy_bandwidth_bytes_per_s"]
    checks = []
    for dtype in (torch.float32, torch.bfloat16):
        depth = Depth(dtype)
        for rows, t, start in ((1, 1, 5), (2, 1, 9), (2, 2, 0), (4, 2, 0), (3, 1, 15), (8, 1, 2)):
            row = check(depth, rows, t, start)
            print(json.dumps(row), flush=True)
            checks.append(row)
        del depth
    result["checks"] = checks
    result["checks_ok"] = all(c["ok"] for c in checks)
    depth = Depth(torch.bfloat16)
    return tune_then_time(result, args, lambda: tune(depth, bandwidth), lambda best: layer_steps(depth, best), "fused")


if __name__ == "__main__":
    raise SystemExit(main())
