"""Run by tests/fastpath/test_fused.py in a subprocess with TRITON_INTERPRET=1: the depth head kernel
(engine/fastpath/fused.py `depth_head`: final RMSNorm, the codebook's head in FP32, CFG) executed by Triton's
interpreter on CPU tensors against its torch form, at shrunk shapes: one CFG stream, a CFG stream beside one
without (its cond and uncond rows the same), a stream with two guidance scales (a third row) beside both,
rows strided as the depth prefill's last position, masked classes. Prints one JSON line per case; exits
non-zero on a mismatch."""

from __future__ import annotations

import json
import sys

import torch

from breeze_worker.engine.fastpath import fused


def _case(rows: int, t: int, cond: list[int], uncond: list[int], dtype: torch.dtype, weight_dtype: torch.dtype,
          block_v: int, seed: int, third: list[int] | None = None) -> dict:
    g = torch.Generator().manual_seed(seed)
    hidden, vocab = 64, 83
    x = torch.randn(rows, t, hidden, generator=g).to(dtype)[:, -1]  # strided when t > 1
    w_norm = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    head = (0.2 * torch.randn(hidden, vocab, generator=g)).to(weight_dtype)
    cond_row, uncond_row = torch.tensor(cond), torch.tensor(uncond)
    scale = 1.0 + torch.rand(len(cond), generator=g)
    thirds = {}
    if third is not None:  # the third rows and their scales (0 where a stream has none: third == uncond)
        ref_row = torch.tensor(third)
        ref_scale = torch.where(ref_row != uncond_row, 0.5 + torch.rand(len(cond), generator=g), 0.0)
        thirds = {"ref_row": ref_row, "ref_scale": ref_scale}
    out = {}
    for mode in ("torch", "kernel"):
        ks = fused.KernelSettings(plans={"depth_head": {"block_v": block_v}}, use_triton=mode == "kernel")
        out[mode] = fused.depth_head(x, w_norm, 1e-5, head, cond_row, uncond_row, scale, ks, **thirds)
    ref = out["torch"]
    err = ((ref - out["kernel"]).abs().max() / ref.abs().max()).item()
    tol = 1e-5 if dtype == weight_dtype == torch.float32 else 2e-3
    cfg_streams = [i for i, (c, u) in enumerate(zip(cond, uncond)) if c != u]
    no_cfg = [i for i, (c, u) in enumerate(zip(cond, uncond)) if c == u]
    # a stream without CFG (c == u) gets its row's own logits, whatever its scale
    row_logits = fused._rms(x, w_norm, 1e-5, head.dtype).float() @ head.float()
    plain = all(((out["kernel"][i] - row_logits[cond[i]]).abs().max() / row_logits[cond[i]].abs().max()).item() <= tol
                for i in no_cfg)
    dual = [i for i in range(len(cond)) if third is not None and third[i] != uncond[i]]
    if dual:  # a three-row stream against the formula over its rows' own logits
        rs = thirds["ref_scale"]
        want = {i: row_logits[uncond[i]] + rs[i] * (row_logits[third[i]] - row_logits[uncond[i]])
                + scale[i] * (row_logits[cond[i]] - row_logits[uncond[i]]) for i in dual}
        plain = plain and all(((out["kernel"][i] - w).abs().max() / w.abs().max()).item() <= tol
                              for i, w in want.items())
    return {"rows": rows, "t": t, "streams": len(cond), "strided": x.stride(0) != hidden, "dtype": str(dtype),
            "weights": str(weight_dtype), "err": err, "no_cfg_streams": len(no_cfg), "cfg_streams": len(cfg_streams),
            "dual_streams": len(dual),
            "ok": err <= tol and plain and bool(torch.isfinite(out["kernel"]).all())}


def main() -> int:
    if fused._triton is None:
        print("Triton is not importable", file=sys.stderr)
        return 2
    f32, f16 = torch.float32, torch.float16
    cases = [(2, 1, [0], [1], f32, f32, 16), (3, 2, [0, 1], [2, 1], f32, f32, 32), (2, 2, [0], [1], f16, f16, 16),
             (3, 1, [2, 0], [1, 0], f32, f16, 64)]
    # with third rows: a two-scale stream (rows 0, 1, 2) beside a CFG stream and a plain one; then one alone
    dual_cases = [((6, 2, [0, 3, 5], [2, 4, 5], f32, f32, 32), [1, 4, 5]), ((3, 1, [0], [2], f16, f16, 16), [1])]
    failed = 0
    for i, (case, third) in enumerate([(c, None) for c in cases] + dual_cases):
        report = _case(*case, seed=i, third=third)
        print(json.dumps(report), flush=True)
        failed += not report["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
