"""Does a weight asked into L2 beforehand make the depth MLP's gate/up kernel faster? (results/NOTES.md run 40)

Run 39's frame A/B had every L2 prefetch setting slower than none (commit b1eaac4's
engine/fastpath/prefetch.py, reverted since). This probe isolates the mechanism: the full-size depth gate/up
weight (8192 x 2 rows of 1024, BF16, 33.5 MB) read by the real kernel (fused.norm_gate_up at 2 rows) after L2
was flushed (a 512 MB copy), with, between the flush and the kernel: nothing; a bulk prefetch
(`cp.async.bulk.prefetch.L2`, one chunk a thread) of half or all of it; a per-line prefetch
(`prefetch.global.L2`) of all of it; an ordinary read of all of it (an upper bound: the weight resident in
L2 as far as it fits); each followed by a device sleep of 0, 10 or 40 us. Events around the kernel (and
around the prefetch) give its time; median of REPS. (Run 40 ran it at commit 3dfcc4e, whose bulk prefetch
came from engine/fastpath/prefetch.py with the same chunking: 64 programs of 128 threads.)

    PYTHONPATH=worker:client:protos:scripts python3 scripts/gpu_l2_probe.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

import gpu_fused
from breeze_worker.engine.fastpath import fused

REPS = 15
CLOCK_HZ = 1.98e9  # the SM clock nvidia-smi showed under load (run 36): sleep cycles per us


@triton.jit
def _line_prefetch_kernel(base, nbytes, LINES: tl.constexpr, THREADS: tl.constexpr):
    """Per-line `prefetch.global.L2`: thread t of program p asks for LINES lines of 128 bytes."""
    lane = tl.program_id(0) * THREADS + tl.arange(0, THREADS)
    off = (lane[:, None] * LINES + tl.arange(0, LINES)[None, :]).to(tl.int64) * 128
    ok = (off < nbytes).to(tl.int32)
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                              "=r,l,r", [base + off, ok], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _bulk_prefetch_kernel(base, nbytes, chunk, THREADS: tl.constexpr):
    """Bulk `cp.async.bulk.prefetch.L2`: thread t of program p asks for chunk p * THREADS + t (a multiple of 16)."""
    lane = (tl.program_id(0) * THREADS + tl.arange(0, THREADS)).to(tl.int64)
    size = tl.maximum(tl.minimum(nbytes - lane * chunk, chunk), 0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [base + lane * chunk, size], dtype=tl.int32, is_pure=False, pack=1)


def bulk_prefetch(weight: torch.Tensor, start_row: int, rows: int, threads: int = 128, programs: int = 64) -> None:
    row_bytes = weight.stride(0) * weight.element_size()
    nbytes = rows * row_bytes
    chunk = -(-nbytes // (threads * programs * 16)) * 16
    _bulk_prefetch_kernel[(programs,)](weight.data_ptr() + start_row * row_bytes, nbytes, chunk, THREADS=threads,
                                       num_warps=threads // 32)


def line_prefetch(weight: torch.Tensor) -> None:
    nbytes = weight.numel() * weight.element_size()
    lines, threads = 16, 128
    grid = -(-nbytes // (128 * lines * threads))
    _line_prefetch_kernel[(grid,)](weight.data_ptr(), nbytes, LINES=lines, THREADS=threads, num_warps=4)


@torch.no_grad()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    doc = {"schema": "breeze-l2-probe/1", **gpu_fused.gpu_result("cuda")}
    props = torch.cuda.get_device_properties(0)
    doc["l2_bytes"] = getattr(props, "L2_cache_size", None)
    gen = torch.Generator(device="cuda").manual_seed(5)
    inter, hidden = 8192, 1024
    weight = (0.02 * torch.randn(2 * inter, hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    w_norm = (1 + 0.1 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    x = torch.randn(2, 1, hidden, generator=gen, device="cuda").to(torch.bfloat16)
    flush_src = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    flush_dst = torch.empty_like(flush_src)
    before = {
        "none": lambda: None,
        "bulk_half": lambda: (bulk_prefetch(weight, 0, inter // 2), bulk_prefetch(weight, inter, inter // 2)),
        "bulk_all": lambda: bulk_prefetch(weight, 0, 2 * inter),
        "line_all": lambda: line_prefetch(weight),
        "read_all": lambda: weight.view(torch.int16).max(),
    }
    ref = fused.norm_gate_up(x, w_norm, 1e-5, weight, inter)
    rows = []
    for sleep_us in (0, 10, 40):
        for name, fn in before.items():
            kernel_us, issue_us = [], []
            for _ in range(REPS):
                flush_dst.copy_(flush_src)
                e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                e[0].record()
                fn()
                e[1].record()
                if sleep_us:
                    torch.cuda._sleep(int(sleep_us * CLOCK_HZ / 1e6))
                e[2].record()
                out = fused.norm_gate_up(x, w_norm, 1e-5, weight, inter)
                e[3].record()
                e[3].synchronize()
                issue_us.append(1000 * e[0].elapsed_time(e[1]))
                kernel_us.append(1000 * e[2].elapsed_time(e[3]))
            row = {"before": name, "sleep_us": sleep_us, "kernel_us": statistics.median(kernel_us),
                   "issue_us": statistics.median(issue_us), "same_output": bool(torch.equal(out, ref))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    # warm: the kernel twice in a row, the second timed (what stays in L2 from the first)
    for _ in range(3):
        flush_dst.copy_(flush_src)
        fused.norm_gate_up(x, w_norm, 1e-5, weight, inter)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fused.norm_gate_up(x, w_norm, 1e-5, weight, inter)
        b.record()
        b.synchronize()
    rows.append({"before": "same kernel just before", "sleep_us": 0, "kernel_us": 1000 * a.elapsed_time(b)})
    print(json.dumps(rows[-1]), flush=True)
    doc["rows"] = rows
    doc["weight_bytes"] = weight.numel() * 2
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    print("before      sleep  kernel us  issue us")
    for r in rows:
        print(f"{r['before']:<24} {r['sleep_us']:>4} {r['kernel_us']:>8.2f} {r.get('issue_us', 0):>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
