"""Weights asked into L2 ahead of the kernel that reads them (Hopper's bulk prefetch), plan "l2".

Why: a decode step's kernels alternate between a few latency-bound ones that read little (a depth layer's
q/k/v projection, attention and output projection: ~5 MB in ~8 us on the H200, under a fifth of the memory
bandwidth) and the MLP's two projections that stream ~50 MB. While the small kernels run, DRAM idles; the
MLP then reads its weights at ~2.2-2.6 TB/s against a ~4.3 TB/s copy bandwidth (results/NOTES.md run 28).
A kernel early in the layer can ask for a later kernel's weights with `cp.async.bulk.prefetch.L2` (PTX ISA
8.0, sm_90: fire and forget, no registers, no wait), so those bytes travel while the small kernels run and
the MLP finds part of its weights in L2 (50 MB on an H100/H200). A prefetch is only a hint: the arithmetic,
hence every bit of the output, is the same with it or without it.

Two ways in:
- inside the fused kernels (fastpath/fused.py): `_qkv_rope_kernel`, `_norm_gate_up_kernel` and
  `_down_residual_kernel` take up to two byte ranges and issue the prefetch right after their own weight
  loads (`kernel_args`); which ranges each asks for is `fused.layer_prefetch`'s choice from plan "l2";
- before a layer of the library-GEMM forms (`launch`: one small kernel, plan "l2_gemm").

Each thread of the launch issues at most one prefetch of `chunk` bytes: thread g of the launch takes chunk g
of the two ranges laid end to end. Off the Hopper path (compute capability < 9.0, the CPU, Triton's
interpreter, which cannot run inline PTX) nothing is issued and the kernels compile without it.
"""

from __future__ import annotations

import importlib.util
import os

import torch

NONE = (0, 0, 0, 0)  # (address a, bytes a, address b, bytes b): nothing to prefetch
_MIN_CHUNK = 512  # bytes: below this a thread's prefetch costs more to issue than it moves

_triton = None
if importlib.util.find_spec("triton") is not None:
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _chunks(a_addr, a_bytes, b_addr, b_bytes, chunk, first, THREADS: tl.constexpr):
            """Chunks first .. first + THREADS - 1 of the byte ranges [a_addr, +a_bytes) and [b_addr, +b_bytes)
            laid end to end, one per thread: (address, bytes) each, 0 bytes past the end."""
            c = first + tl.arange(0, THREADS).to(tl.int64)
            a_chunks = (a_bytes + chunk - 1) // chunk
            in_a = c < a_chunks
            off = tl.where(in_a, c, c - a_chunks) * chunk
            size = tl.minimum(tl.where(in_a, a_bytes, b_bytes) - off, chunk)
            return tl.where(in_a, a_addr, b_addr) + off, tl.maximum(size, 0).to(tl.int32)

        @triton.jit
        def _issue(addr, size):
            """One bulk L2 prefetch per element (none where size is 0)."""
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)

        @triton.jit
        def _prefetch_l2(a_addr, a_bytes, b_addr, b_bytes, chunk, first, THREADS: tl.constexpr):
            """`_chunks`' chunks asked into L2 (a fused kernel calls this after its own weight loads)."""
            addr, size = _chunks(a_addr, a_bytes, b_addr, b_bytes, chunk, first, THREADS)
            _issue(addr, size)

        @triton.jit
        def _prefetch_l2_kernel(a_addr, a_bytes, b_addr, b_bytes, chunk, record_ptr, THREADS: tl.constexpr,
                                RECORD: tl.constexpr):
            """`launch`'s kernel. RECORD (the interpreter test): each thread's (address, bytes) stored into
            record_ptr [threads, 2] instead of issued."""
            first = tl.program_id(0) * THREADS
            addr, size = _chunks(a_addr, a_bytes, b_addr, b_bytes, chunk, first, THREADS)
            if RECORD:
                lanes = first + tl.arange(0, THREADS)
                tl.store(record_ptr + 2 * lanes, addr)
                tl.store(record_ptr + 2 * lanes + 1, size.to(tl.int64))
            else:
                _issue(addr, size)

        _triton = triton
    except Exception:  # an unusable Triton: no prefetch
        _triton = None

_override: bool | None = None  # scripts: forced on or off regardless of the device
_devices: dict[int, bool] = {}


def available(device: torch.device) -> bool:
    """Whether bulk L2 prefetches can be issued on `device`: CUDA, compute capability >= 9.0, Triton, not
    its interpreter."""
    if device.type != "cuda" or _triton is None or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if _override is not None:
        return _override
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _devices:
        _devices[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _devices[index]


def rows(weight: torch.Tensor, fraction: float, start: int = 0, count: int | None = None) -> tuple[int, int]:
    """(address, bytes) of the first `fraction` of rows start .. start + count - 1 of a row-major `weight`
    (count: to the end). The byte count is a multiple of 16, as the prefetch needs."""
    if not weight.is_contiguous():
        raise ValueError("L2 prefetch ranges need a contiguous weight")
    count = weight.shape[0] - start if count is None else count
    n = int(round(max(0.0, min(1.0, fraction)) * count))
    row_bytes = weight.stride(0) * weight.element_size()
    size = (n * row_bytes) // 16 * 16
    return (weight.data_ptr() + start * row_bytes, size) if size else (0, 0)


def regions(a: tuple[int, int] = (0, 0), b: tuple[int, int] = (0, 0)) -> tuple[int, int, int, int]:
    """Two (address, bytes) ranges as one prefetch request (either may be empty)."""
    return (a[0], a[1], b[0], b[1])


def chunk_bytes(request: tuple[int, int, int, int], threads: int) -> int:
    """The per-thread prefetch size (a multiple of 16) with which `threads` threads cover `request`: each range
    starts a chunk of its own, so two ranges may need one thread more than their sum over the chunk."""
    total = request[1] + request[3]
    ranges = (request[1] > 0) + (request[3] > 0)
    per = -(-total // max(1, threads - ranges + 1))
    return max(_MIN_CHUNK, -(-per // 16) * 16)


def chunk_count(request: tuple[int, int, int, int], chunk: int) -> int:
    """How many threads `request` occupies at `chunk` bytes each."""
    return -(-request[1] // chunk) + -(-request[3] // chunk)


def kernel_args(request: tuple[int, int, int, int] | None, programs: int, num_warps: int) -> dict:
    """The prefetch arguments of a fused kernel launched as `programs` programs of `num_warps` warps."""
    threads = 32 * num_warps
    if request is None or request[1] + request[3] == 0:
        return {"pf_a": 0, "pf_an": 0, "pf_b": 0, "pf_bn": 0, "pf_chunk": 16, "PF": False, "PF_THREADS": threads}
    return {"pf_a": request[0], "pf_an": request[1], "pf_b": request[2], "pf_bn": request[3],
            "pf_chunk": chunk_bytes(request, programs * threads), "PF": True, "PF_THREADS": threads}


def launch(request: tuple[int, int, int, int] | None, device: torch.device, threads: int = 128,
           programs: int = 64, record: torch.Tensor | None = None) -> bool:
    """Issue `request` from one small kernel (the library-GEMM forms, before a layer). False: nothing issued.
    `record` (tests, Triton's interpreter): int64 [programs * threads, 2] receives each thread's (address,
    bytes) instead."""
    if request is None or request[1] + request[3] == 0:
        return False
    if record is None and not available(device):
        return False
    chunk = chunk_bytes(request, programs * threads)
    grid = -(-chunk_count(request, chunk) // threads)
    _prefetch_l2_kernel[(grid,)](*request, chunk, record if record is not None else torch.empty(0, device=device),
                                 THREADS=threads, RECORD=record is not None, num_warps=threads // 32)
    return True
