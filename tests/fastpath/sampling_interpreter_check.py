"""Run by tests/fastpath/test_fused_sampling.py in a subprocess with TRITON_INTERPRET=1: the sampling kernel
(engine/fastpath/fused_sampling.py) executed by Triton's interpreter on CPU tensors against
engine/sampling.py: the kept set against `_sorted_keep` and the codes against `sample_rows`, over ties,
signed zeros, blocked ids, rows with fewer finite tokens than top-k, greedy rows and non-finite rows.
Prints one JSON line per case; exits non-zero if any case mismatches."""

from __future__ import annotations

import json
import sys

import torch

from breeze_worker.engine.fastpath import fused_sampling
from breeze_worker.engine.sampling import RowSampling, exponential_noise, filter_rows, sample_rows, uniform_open


def _logits(g: torch.Generator, kind: str, rows: int, vocab: int) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=g) * 3
    if kind == "ties":  # values on a coarse grid: long runs of equal logits around every threshold
        x = (x * 2).round() / 2
        x[0] = 1.0  # one row all tied
        x[1, :40] = 6.0  # a tied group at the top straddling top-k 10
    elif kind == "zeros":  # +0.0 and -0.0 must count as one value
        x = (x * 0.7).round()
        x[:, ::3] = -0.0
        x[:, 1::3] = 0.0
    elif kind == "sparse":  # fewer finite tokens than top-k, and the finite "never" of the end-of-speech mask
        x[:, 7:] = float("-inf")
        x[1, :3] = -1e30
    elif kind == "peaked":  # one or three leaders holding nearly all the mass: the nucleus inside a tie
        x[:, :3] = 25.0
        x[0, 1:3] = 0.0
    elif kind == "tail":  # the leaders (and a tie across the two blocks) past the split's head block
        x[:, vocab - 3:] = 25.0
        x[0, vocab - 2:] = 0.0
        x[1, 1000] = x[1, vocab - 1] = 30.0  # tied maximum in both blocks: the first index wins
    return x


def _case(kind: str, seed: int, vocab: int = 2051, extreme: bool = False) -> dict:
    """`extreme`: every token the filters cut gets the smallest noise the generator can produce (the largest
    hash), the draw most likely to escape a filter if the noise could reach 0. Every case also has the
    kernel write the next input: rows of a table to each stream's cond and uncond rows (equal for some
    streams, as without CFG), and checks them against the table at the drawn codes."""
    g = torch.Generator().manual_seed(seed)
    top_k = [50, 10, 0, 1, 2051, 4000, 7, 300]
    top_p = [1.0, 0.9, 0.8, 1.0, 0.5, 1e-6, 0.97, 0.3]
    temperature = [0.9, 1.0, 0.7, 1.3, 0.0, 1.0, 0.5, 1.1]  # row 4 greedy
    rows = len(top_k)
    sampling = RowSampling(temperature=torch.tensor(temperature), top_k=torch.tensor(top_k),
                           top_p=torch.tensor(top_p), repetition_penalty=torch.ones(rows),
                           seed=torch.arange(rows, dtype=torch.int64) * 131 + seed)
    blocked = torch.zeros(vocab, dtype=torch.bool)
    blocked[2048:2051] = True  # the reserved codes; 2051 (codebook 0's end of speech) and above stay open
    blocked[5] = True
    logits = _logits(g, kind, rows, vocab)
    if kind == "nonfinite":
        logits[2, 100] = float("nan")
        logits[5, 3] = float("inf")
    frame = torch.full((rows,), seed, dtype=torch.int64)
    noise = exponential_noise(sampling.seed, frame, 3, vocab)
    if extreme:
        smallest = -torch.log(uniform_open(torch.tensor(2**32 - 1)))
        noise = torch.where(filter_rows(logits, sampling, blocked)[1], noise, smallest)
    flags = torch.zeros(rows, dtype=torch.bool)
    flags[7] = True  # a flag set earlier in the frame stays set
    keep = torch.zeros(rows, vocab, dtype=torch.int8)
    table = torch.randn(vocab, 24, generator=g)
    # stream s owns rows from 3s: one row, a CFG pair, or three rows (two guidance scales), in turn
    kind_of = torch.arange(rows) % 3
    cond_row = torch.arange(rows) * 3
    uncond_row = torch.where(kind_of == 0, cond_row, cond_row + 1 + (kind_of == 2).long())
    ref_row = torch.where(kind_of == 2, cond_row + 1, uncond_row)
    next_out = torch.full((3 * rows, 1, 24), 7.0)  # rows no stream owns are left alone
    codes = torch.zeros(rows, 4, dtype=torch.int64)
    code = fused_sampling.sample(logits, sampling, blocked, torch.log(noise), flags, keep_out=keep,
                                 out=codes[:, 2], next_table=table, next_out=next_out, cond_row=cond_row,
                                 uncond_row=uncond_row, ref_row=ref_row)
    want_next = table[code.clamp(0, vocab - 1)]
    owned = torch.zeros(3 * rows, dtype=torch.bool)
    owned[torch.cat([cond_row, uncond_row, ref_row])] = True
    next_ok = (all(torch.equal(next_out[r, 0], want_next) for r in (cond_row, uncond_row, ref_row))
               and bool((next_out[~owned] == 7.0).all()) and torch.equal(codes[:, 2], code)
               and not codes[:, [0, 1, 3]].any())

    scaled, expected_keep = filter_rows(logits, sampling, blocked)
    finite_rows = torch.isfinite(logits).all(-1)
    # -inf rows ("sparse") still compare; NaN or +inf leave the filters undefined (the frame is dropped)
    comparable = ~(torch.isnan(logits) | torch.isposinf(logits)).any(-1)
    expected_code = sample_rows(logits, sampling, frame, 3, blocked, noise=noise)
    same_keep = (keep.bool() == expected_keep).all(-1) | ~comparable
    same_code = (code == expected_code) | ~comparable
    flags_ok = torch.equal(flags, ~finite_rows | (torch.arange(rows) == 7))
    filtered = bool((keep.sum(-1) < torch.isfinite(scaled).sum(-1)).any())
    inside = bool(expected_keep.gather(1, code.clamp(0, vocab - 1)[:, None]).all()) and not bool(blocked[code].any())
    ok = bool(same_keep.all()) and bool(same_code.all()) and flags_ok and next_ok and (inside or not extreme)
    return {"kind": kind, "seed": seed, "vocab": vocab, "next_ok": next_ok,
            "blocks": list(fused_sampling.blocks(vocab)), "ok": ok,
            "keep_rows_equal": int(same_keep.sum()),
            "code_rows_equal": int(same_code.sum()), "rows": rows, "flags_ok": flags_ok,
            "nonfinite_rows": int((~finite_rows).sum()), "extreme": extreme, "inside_filter": inside,
            "compared_rows": int(comparable.sum()), "filtered_something": filtered,
            "kept": keep.sum(-1).tolist()}


def _frames_case(cfg: bool, top_p: float | None) -> dict:
    """The kernel inside the fast path's frame step (tiny model, FP32): the eager reference's frames."""
    from breeze_worker.config import FastPathSettings
    from breeze_worker.engine.eager import EagerFrameGenerator
    from breeze_worker.engine.fastpath.generator import FastFrameGenerator
    from breeze_worker.engine.request import resolve_request
    from breeze_worker.engine.types import SamplingOverrides, SynthesisRequest
    from breeze_worker.model.tiny import tiny_model

    model = tiny_model(seed=0, with_codec=False)
    req = SynthesisRequest(text="hello there", instruction="calm and slow" if cfg else None,
                           cfg_scale=2.0 if cfg else None, seed=11, max_frames=5,
                           sampling=SamplingOverrides(top_p=top_p))
    request = resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)
    eager = list(EagerFrameGenerator(model, request, "cpu"))
    calls = []
    kernel = fused_sampling.sample

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return kernel(*args, **kwargs)

    fused_sampling.sample = counted
    try:  # "auto" picks the kernel on CUDA only
        fast = list(FastFrameGenerator(model, request, "cpu", settings=FastPathSettings(sampler="kernel")))
    finally:
        fused_sampling.sample = kernel
    equal = len(eager) == len(fast) == 5 and all(torch.equal(e, f) for e, f in zip(eager, fast))
    # 16 positions a frame, one stream row each (CFG rows are combined first)
    return {"kind": "frames", "cfg": cfg, "top_p": top_p, "kernel_calls": len(calls), "frames": len(fast),
            "streams": sorted({shape[0] for shape in calls}), "ok": equal and len(calls) == 16 * len(fast)}


def main() -> int:
    cases = [_case(kind, seed) for seed, kind in enumerate(("plain", "ties", "zeros", "sparse", "peaked",
                                                             "nonfinite", "plain", "ties"))]
    # the block layouts: 2051 and 2052 classes as 2048 + 4, 3000 as 2048 + 1024 (72 lanes masked), a power of
    # two (no tail), leaders in the tail block
    cases += [_case(kind, 20 + seed, vocab) for seed, (kind, vocab) in enumerate(
        (("tail", 2052), ("ties", 2051), ("nonfinite", 3000), ("tail", 3000), ("plain", 2048)))]
    cases += [_case("plain", 60, extreme=True), _case("peaked", 61, extreme=True)]
    cases += [_frames_case(False, None), _frames_case(True, 0.8)]
    for case in cases:
        print(json.dumps(case))
    return 0 if all(c["ok"] for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
