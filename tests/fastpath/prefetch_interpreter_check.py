"""Run by tests/fastpath/test_prefetch.py in a subprocess with TRITON_INTERPRET=1: the L2 prefetch kernel
(engine/fastpath/prefetch.py) in its recording mode, which stores each thread's (address, bytes) instead of
issuing the prefetch (the interpreter cannot run inline PTX). Per case, the chunks must cover both byte ranges
exactly once, each a multiple of 16 bytes, with nothing outside them. Prints one JSON line per case; exits
non-zero on a failure."""

from __future__ import annotations

import json
import sys

import torch

from breeze_worker.engine.fastpath import prefetch


def _case(a: tuple[int, int], b: tuple[int, int], threads: int, programs: int) -> dict:
    request = prefetch.regions(a, b)
    record = torch.full((programs * threads, 2), -1, dtype=torch.int64)
    issued = prefetch.launch(request, torch.device("cpu"), threads=threads, programs=programs, record=record)
    chunks = [(int(addr), int(size)) for addr, size in record.tolist() if size > 0]
    written = int((record[:, 0] >= 0).sum())  # every launched thread wrote its record (even past the end: 0 bytes)
    covered: dict[int, int] = {}
    outside = 0
    for addr, size in chunks:
        for start, length in (a, b):
            if start <= addr and addr + size <= start + length:
                covered[start] = covered.get(start, 0) + size
                break
        else:
            outside += 1
    starts = sorted(addr for addr, _ in chunks)
    overlap = any(x[0] + x[1] > y[0] for x, y in zip(sorted(chunks), sorted(chunks)[1:]))
    ok = (issued and outside == 0 and not overlap and all(size % 16 == 0 for _, size in chunks)
          and all(covered.get(start, 0) == length for start, length in (a, b) if length))
    return {"a": a, "b": b, "threads": threads, "programs": programs, "chunks": len(chunks), "written": written,
            "outside": outside, "overlap": overlap, "first": starts[:2], "ok": ok}


def main() -> int:
    cases = [_case((1 << 20, 33 * 1024 * 16), (1 << 30, 5 * 4096), threads=32, programs=8),  # both, uneven ends
             _case((4096, 160), (0, 0), threads=64, programs=2),  # one small range: a single short chunk
             _case((0, 0), (1 << 24, 7 * 1024 * 1024), threads=32, programs=4),  # b only
             _case((1 << 33, 1 << 22), (1 << 34, 1 << 22), threads=128, programs=64)]  # beyond 32-bit addresses
    for case in cases:
        print(json.dumps(case))
    return 0 if all(c["ok"] for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
