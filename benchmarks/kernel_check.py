#!/usr/bin/env python3
"""The kernel check: each Triton kernel the fast path serves, on the model's own packed layers (seeded random
weights, `--size full` by default), timed per call and set against its byte floor, with its difference from
the same computation through the kernels' torch stages.

Parts (`--parts`, default all), at batch 1 with CFG (2 model rows) unless named:
  depth     the depth decoder's layer kernels (`fused+chain`): norm + q/k/v + RoPE + cache write, attention
            over the 16 slots, output projection + residual, norm + gate/up + SiLU, down projection + residual;
            then the layer step, the five chained
  backbone  the backbone's (`fused+chain+all`): norm + q/k/v, q/k norm + RoPE + a write at each row's slot
            (`--slots`), output projection + residual, norm + gate/up + SiLU, down projection + residual
  head      a depth position's final norm, the codebook's head in FP32 and CFG (`depth_head`)
  sampling  one sampling position, the kernel against the torch sampler it replaces (compiled: the pairwise
            filter at one stream, where the fused layer forms run; the sort above), at 1, 8 and 32 streams,
            top-p 1 and 0.9
Time: the calls over every layer (or codebook position) captured in one CUDA graph, replayed `--iters`
times, median, divided by the calls (us a call). Floor: the bytes the call must read (its weights; the caches
for the attention) at the device's measured copy bandwidth. Difference: max |kernel - stages| / max |stages|
of the first call's output, the stages run in float32 on the host from the same (rounded) inputs (the layer
step and the samplers are checked by tests/gpu instead).
On the CPU (`--device cpu`, a smoke run of the tool) the same calls run the torch stages, timed by the wall
clock. Prints a table; `--json FILE` writes it with the device and versions.

    python benchmarks/kernel_check.py --device cuda --json kernels.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import bench_env

PARTS = ("depth", "backbone", "head", "sampling")


def time_us(fn: Callable[[], object], device, iters: int) -> float:
    """Median microseconds of one `fn()`: replayed from a CUDA graph on CUDA, else by the wall clock."""
    import torch

    if device.type != "cuda":
        fn()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # kernels built, workspaces allocated outside the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def on_host(value):
    """A call's tensors as float32 host copies (other values as they are): the torch stages' inputs."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float32 if value.is_floating_point() else value.dtype).clone()
    return value


def difference(fn: Callable, args: tuple, kwargs: dict, device) -> float | None:
    """max |fn on the device - fn on float32 host copies| / max |host result| (on the CPU both are the torch
    stages: 0 in FP32, the inputs' rounding otherwise)."""
    got = fn(*args, **kwargs).float().cpu()
    want = fn(*[on_host(a) for a in args], **{k: on_host(v) for k, v in kwargs.items()}).float()
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


class Part:
    """The entries of one part: name, us a call, floor us, x floor, difference."""

    def __init__(self, name: str, device, bandwidth: float | None, iters: int):
        self.name, self.device, self.bandwidth, self.iters = name, device, bandwidth, iters
        self.rows: list[dict] = []

    def add(self, entry: str, calls: list[tuple[Callable, tuple, dict]], read_bytes: int, note: str = "",
            compare: bool = True) -> None:
        """`calls`: (fn, args, kwargs) per layer; timed together, reported per call; the first one compared
        with its torch stages unless `compare` is off (arguments that are not tensors, such as a layer)."""
        us = time_us(lambda: [fn(*a, **k) for fn, a, k in calls], self.device, self.iters) / len(calls)
        floor = read_bytes / self.bandwidth * 1e6 if self.bandwidth else None
        fn, args, kwargs = calls[0]
        row = {"part": self.name, "kernel": entry, "us": us, "floor_us": floor,
               "x_floor": us / floor if floor else None,
               "difference": difference(fn, args, kwargs, self.device) if compare else None,
               "calls": len(calls), "note": note}
        self.rows.append(row)
        shown = "-" if floor is None else f"{floor:7.2f}"
        diff = "-" if row["difference"] is None else f"{row['difference']:.1e}"
        print(f"{self.name:9} {entry:22} {us:9.2f} us  floor {shown} us  diff {diff}  {note}", flush=True)


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _add_output_and_mlp(part: Part, layers, x, attn, hidden, ws) -> None:
    """The kernels after attention, the same in both decoders: the output projection into the residual, the
    norm + gate/up projection, and the down projection into the residual."""
    from breeze_worker.engine.fastpath import fused

    first = layers[0]
    part.add("o_residual", [(fused.down_residual, (attn, layer.attn.o_proj.weight, x, ws), {"kernel": "o_residual"})
                            for layer in layers], _nbytes(first.attn.o_proj.weight))
    part.add("norm_gate_up", [(fused.norm_gate_up, (x, layer.w_post, layer.eps_post, layer.gate_up,
                                                    layer.intermediate), {}) for layer in layers],
             _nbytes(first.gate_up))
    part.add("down_residual", [(fused.down_residual, (hidden, layer.mlp.down_proj.weight, x, ws), {})
                               for layer in layers], _nbytes(first.mlp.down_proj.weight))


def depth_part(model, part: Part, rows: int) -> None:
    import torch

    from breeze_worker.engine.fastpath import fused
    from breeze_worker.engine.fastpath.step import packed_layers

    layers = packed_layers(model.lm)[1]
    device, dtype = part.device, layers[0].qkv.dtype
    first = layers[0]
    slots, start = model.lm.config.num_codebooks, 5
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, 1, first.w_in.shape[0], generator=g, device=device).to(dtype)
    caches = [(torch.randn(rows, first.kv_heads, slots, first.head_dim, generator=g, device=device).to(dtype),
               torch.randn(rows, first.kv_heads, slots, first.head_dim, generator=g, device=device).to(dtype))
              for _ in layers]
    cos, sin = model.lm.depth_decoder.model.rotary(torch.arange(start, start + 1, device=device), dtype)
    allowed = torch.arange(slots, device=device)[None, :] <= start
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None].contiguous()
    attn = torch.randn(rows, 1, first.heads * first.head_dim, generator=g, device=device).to(dtype)
    hidden = torch.randn(rows, 1, first.intermediate, generator=g, device=device).to(dtype)
    ws = fused.DownWorkspace()
    shape = dict(heads=first.heads, kv_heads=first.kv_heads, head_dim=first.head_dim)
    qs = [fused.qkv_rope(x, layer.w_in, layer.eps_in, layer.qkv, cos, sin, k, v, start, **shape)
          for layer, (k, v) in zip(layers, caches)]
    part.add("qkv_rope", [(fused.qkv_rope, (x, layer.w_in, layer.eps_in, layer.qkv, cos, sin, k, v, start), shape)
                          for layer, (k, v) in zip(layers, caches)], _nbytes(first.qkv))
    part.add("depth_attention", [(fused.depth_attention, (q, k, v, mask, start), {"scale": layer.scale})
                                 for layer, q, (k, v) in zip(layers, qs, caches)], _nbytes(*caches[0]))
    _add_output_and_mlp(part, layers, x, attn, hidden, ws)

    def step(layer, k, v):
        q = fused.qkv_rope(x, layer.w_in, layer.eps_in, layer.qkv, cos, sin, k, v, start, **shape)
        out = fused.depth_attention(q, k, v, mask, start, scale=layer.scale)
        h = fused.down_residual(out, layer.attn.o_proj.weight, x, ws, kernel="o_residual")
        return fused.down_residual(fused.norm_gate_up(h, layer.w_post, layer.eps_post, layer.gate_up,
                                                      layer.intermediate), layer.mlp.down_proj.weight, h, ws)

    part.add("layer_step", [(step, (layer, k, v), {}) for layer, (k, v) in zip(layers, caches)],
             _nbytes(first.qkv, first.attn.o_proj.weight, first.gate_up, first.mlp.down_proj.weight, *caches[0]),
             note=f"the five kernels, chained: {fused.pdl(device)}", compare=False)


def backbone_part(model, part: Part, rows: int, slots: int) -> None:
    import torch

    from breeze_worker.engine.fastpath import fused
    from breeze_worker.engine.fastpath.step import packed_layers

    layers = packed_layers(model.lm)[0]
    device, dtype = part.device, layers[0].qkv.dtype
    first = layers[0]
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(rows, 1, first.w_in.shape[0], generator=g, device=device).to(dtype)
    width = (first.heads + 2 * first.kv_heads) * first.head_dim
    proj = torch.randn(rows, 1, width, generator=g, device=device).to(dtype)
    caches = [(torch.randn(rows, first.kv_heads, slots, first.head_dim, generator=g, device=device).to(dtype),
               torch.randn(rows, first.kv_heads, slots, first.head_dim, generator=g, device=device).to(dtype))
              for _ in layers]
    position = torch.tensor([[slots // 2 + r] for r in range(rows)], device=device)  # each row its own slot
    cos, sin = model.lm.backbone_model.rotary(position, dtype)  # [R, 1, D]
    cos, sin = cos[:, None].contiguous(), sin[:, None].contiguous()
    attn = torch.randn(rows, 1, first.heads * first.head_dim, generator=g, device=device).to(dtype)
    hidden = torch.randn(rows, 1, first.intermediate, generator=g, device=device).to(dtype)
    ws = fused.DownWorkspace()
    shape = dict(heads=first.heads, kv_heads=first.kv_heads, head_dim=first.head_dim)
    part.add("norm_linear (q/k/v)", [(fused.norm_linear, (x, layer.w_in, layer.eps_in, layer.qkv), {})
                                     for layer in layers], _nbytes(first.qkv))
    part.add("qk_norm_rope", [(fused.qk_norm_rope, (proj, layer.qk_norm, layer.qk_eps, cos, sin, k, v, position),
                               shape) for layer, (k, v) in zip(layers, caches)],
             _nbytes(proj) + 2 * rows * first.kv_heads * first.head_dim * caches[0][0].element_size())
    _add_output_and_mlp(part, layers, x, attn, hidden, ws)


def head_part(model, part: Part, rows: int) -> None:
    import torch

    from breeze_worker.engine.fastpath import fused

    lm = model.lm
    norm = lm.depth_decoder.model.norm
    head = lm.depth_decoder.codebooks_head.weight
    heads = [head[p - 1] for p in range(1, lm.config.num_codebooks)]
    dtype = heads[0].dtype
    g = torch.Generator(device=part.device).manual_seed(2)
    x = torch.randn(rows, 2, heads[0].shape[0], generator=g, device=part.device).to(dtype)[:, -1]  # strided rows
    cond = torch.tensor([0], device=part.device)
    uncond = torch.tensor([rows - 1], device=part.device)
    scale = torch.tensor([2.0], device=part.device)
    part.add("depth_head", [(fused.depth_head, (x, norm.weight, norm.eps, w, cond, uncond, scale), {})
                            for w in heads], _nbytes(heads[0]), note="one stream with CFG")


def _pick(logits, rows, blocked, noise, flags, pairwise: bool):
    """The torch sampler as the step runs it without the kernel: the finiteness flags, then `sample_rows`."""
    import torch

    from breeze_worker.engine.sampling import sample_rows

    flags |= ~torch.isfinite(logits).all(dim=-1)
    return sample_rows(logits, rows, torch.zeros_like(rows.seed), 0, blocked, noise=noise, pairwise=pairwise)


def sampling_part(model, part: Part, compile_torch: bool) -> None:
    import torch

    from breeze_worker.engine.fastpath import fused_sampling
    from breeze_worker.engine.fastpath.compiled import compile_unit
    from breeze_worker.engine.sampling import RowSampling, exponential_noise

    device, vocab = part.device, model.config.vocab_size
    picker = compile_unit(_pick) if compile_torch else _pick
    for streams in (1, 8, 32):
        for top_p in (1.0, 0.9):
            g = torch.Generator(device=device).manual_seed(streams)
            logits = torch.randn(streams, vocab, generator=g, device=device) * 3
            blocked = torch.zeros(vocab, dtype=torch.bool, device=device)
            blocked[list(model.config.reserved_code_ids)] = True
            z = dict(device=device)
            rows = RowSampling(temperature=torch.full((streams,), 0.9, **z),
                               top_k=torch.full((streams,), 50, dtype=torch.int64, **z),
                               top_p=torch.full((streams,), top_p, **z), repetition_penalty=torch.ones(streams, **z),
                               seed=torch.arange(streams, dtype=torch.int64, **z) * 17 + 5)
            noise = exponential_noise(rows.seed, torch.zeros(streams, dtype=torch.int64, **z), 1, vocab)
            log_noise = torch.log(noise)
            flags = torch.zeros(streams, dtype=torch.bool, **z)
            label = f"{streams} streams, top-p {top_p:g}"
            if fused_sampling.available(device):
                part.add("sample (kernel)", [(fused_sampling.sample, (logits, rows, blocked, log_noise, flags), {})],
                         _nbytes(logits, log_noise), note=label, compare=False)
            pairwise = streams == 1  # FrameStep: pairwise in the fused forms (up to 2 rows), sorted above
            part.add(f"sample (torch, {'pairwise' if pairwise else 'sorted'})",
                     [(picker, (logits, rows, blocked, noise, flags, pairwise), {})], _nbytes(logits, noise),
                     note=label + ("" if compile_torch else ", not compiled"), compare=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/kernel_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (a smoke run: the torch stages)")
    p.add_argument("--size", default="full", choices=("full", "mid", "tiny"), help="random-weight model size")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp16-mixed", "fp32"))
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--rows", type=int, default=2, help="model rows (2: one stream with CFG)")
    p.add_argument("--slots", type=int, default=256, help="backbone cache slots")
    p.add_argument("--iters", type=int, default=7, help="timed graph replays (median)")
    p.add_argument("--no-compile", action="store_true", help="the torch sampler uncompiled (default off CUDA)")
    p.add_argument("--seed", type=int, default=1234, help="the model's weights")
    p.add_argument("--commit", default=None, help="commit to record (default: $BREEZE_COMMIT, else git)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    parts = [name for name in args.parts.split(",") if name]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    bench_env.use_source_tree()
    import torch

    from breeze_worker.engine.precision import make_policy
    from breeze_worker.measure.instruments import copy_bandwidth
    from breeze_worker.measure.models import random_model

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = random_model(args.size, args.seed, device, make_policy(args.precision, "kernel check"), with_codec=False)
    bandwidth = copy_bandwidth(device)
    doc = {"meta": bench_env.describe(args.commit), "device": str(device), "size": args.size,
           "precision": args.precision, "rows": args.rows, "copy_bandwidth_bytes_per_s": bandwidth, "kernels": []}
    shown = f"{bandwidth / 1e12:.2f} TB/s" if bandwidth else "not measured"
    print(f"{doc['meta']['gpu'] or device}, copy bandwidth {shown}", flush=True)
    with torch.no_grad():
        for name in parts:
            part = Part(name, device, bandwidth, args.iters)
            if name == "depth":
                depth_part(model, part, args.rows)
            elif name == "backbone":
                backbone_part(model, part, args.rows, args.slots)
            elif name == "head":
                head_part(model, part, args.rows)
            else:
                sampling_part(model, part, compile_torch=device.type == "cuda" and not args.no_compile)
            doc["kernels"] += part.rows
    if args.json:
        bench_env.write_json(args.json, doc)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
