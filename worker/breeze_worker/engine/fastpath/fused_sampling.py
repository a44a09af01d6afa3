"""One Triton kernel for a sampling position of the fast path: the finiteness check, reserved ids masked,
temperature, top-k, top-p and the exponential race, one program per stream row.

Why: compiled from engine/sampling.py, one position's sampling is several kernels (the pairwise top-k
count, the nucleus mass, the race and finiteness check), sixteen times a frame. Here both filters are
bisections over the bits of the logits, in registers:

- A float32 maps to an unsigned 32-bit key with the same order (-0.0 first made +0.0, as the float
  comparison treats them). The top-k threshold T is the largest key with at least k keys >= T (32
  halvings, each a count over the row); the tokens kept are key >= T. That is exactly
  `sampling._sorted_keep`'s set: fewer than k tokens strictly larger, ties kept whole.
- The nucleus: f(t) = the kept tokens' probability mass above key t falls as t grows. With t* the largest
  key where f(t*) >= top_p (32 more halvings), a kept token is in the nucleus exactly when its own mass
  above is < top_p, i.e. key > t*; the most likely token always is (its mass above is 0). The masses
  differ from the sorted cumulative sum only by FP32 summation order, as `_pairwise_keep`'s do. top_p 1
  (the default) and top_k 0 skip their halvings. The top-k search stops early at the first candidate that
  exactly k keys pass (the same set, see `_search`).

A row is held as a power-of-two head block and a small tail block (`blocks`; 2051 classes as 2048 + 4
lanes, half the registers of one 4096-lane block): every count, mass and argmax runs over both, the tail's
indices after the head's, so the first index still wins ties. The kernel also writes the next depth
position's projected input (a row of `FrameStep.projected_codes`) and launches chained to the kernel
before it, as the layers' kernels do (fused.pdl).

The race itself is the same arithmetic as `sample_rows`: argmax(filtered - log(noise)), first index on
ties, greedy rows argmax(filtered). `log(noise)` comes in precomputed (the step takes it with the frame's
noise) so the kernel uses no transcendental of its own on that path.
Off CUDA (CI) `sample_rows` serves; `TRITON_INTERPRET=1` runs the kernel on CPU tensors
(tests/fastpath/sampling_interpreter_check.py)."""

from __future__ import annotations

import torch

from breeze_worker.engine.fastpath import fused
from breeze_worker.engine.sampling import RowSampling

if fused._triton is not None:
    import triton
    import triton.language as tl

    from breeze_worker.engine.fastpath.fused_kernels import gdc_launch_dependents, gdc_wait

    @triton.jit
    def _above(skey, ok, probs, cand, AXIS: tl.constexpr, MASS: tl.constexpr):
        """Per candidate key (`cand` broadcast against the row): the probability mass of the keys > it
        (MASS), or how many keys are >= it; reduced along AXIS."""
        if MASS:
            above = tl.sum(tl.where(skey > cand, probs, 0.0), axis=AXIS)
        else:
            above = tl.sum((ok & (skey >= cand)).to(tl.int32), axis=AXIS)
        return above

    @triton.jit
    def _above_row(skey, ok, probs, tkey, tok, tprobs, cand, AXIS: tl.constexpr, MASS: tl.constexpr,
                   TAIL: tl.constexpr):
        """`_above` over the whole row: its power-of-two head and, with TAIL, the tail block after it."""
        above = _above(skey, ok, probs, cand, AXIS, MASS)
        if TAIL:
            above += _above(tkey, tok, tprobs, cand, AXIS, MASS)
        return above

    @triton.jit
    def _search(skey, ok, probs, tkey, tok, tprobs, target, MASS: tl.constexpr, TAIL: tl.constexpr,
                EARLY: tl.constexpr = False):
        """The largest unsigned key t (an int64 in [0, 2**32)) where a test holds: MASS False, at least
        `target` keys >= t; MASS True, the probability mass of the keys > t at least `target`. The test
        holds at 0 (the caller's invariant) and fails above its answer, so t is found one bit a step, from
        the top. `skey`: the keys minus 2**31, int32; the row is the head block (skey, ok, probs) and, with
        TAIL, the tail block (tkey, tok, tprobs).

        EARLY (the count search only): stop at the first candidate that exactly `target` keys pass and
        return it. Those keys are then exactly the top `target` (the full search's
        answer t* >= the candidate, and the >= target keys at t* are among the `target` at the candidate), so
        `key >= returned` keeps the same set. With a tie across the boundary no candidate gives exactly
        `target` and all 32 steps run, as without EARLY."""
        t = tl.full([], 0, tl.int64)
        if EARLY:  # the count search, stopped where exactly `target` keys pass (see the docstring)
            step = tl.full([], 0, tl.int32)
            found = tl.full([], 0, tl.int32)
            while (step < 32) & (found == 0):
                bit = tl.full([], 1, tl.int64) << (31 - step).to(tl.int64)
                cand = (t + bit - 2147483648).to(tl.int32)
                above = _above_row(skey, ok, probs, tkey, tok, tprobs, cand, 0, MASS, TAIL)
                t = tl.where(above >= target, t + bit, t)
                found = (above == target).to(tl.int32)
                step += 1
            return t
        for step in tl.static_range(32):
            cand = (t + (1 << (31 - step)) - 2147483648).to(tl.int32)
            above = _above_row(skey, ok, probs, tkey, tok, tprobs, cand, 0, MASS, TAIL)
            t = tl.where(above >= target, t + (1 << (31 - step)), t)
        return t

    @triton.jit
    def _keys(logits_ptr, blocked_ptr, ids, V, temp, greedy):
        """One block of a row: in range, scaled (temperature; reserved ids and lanes past V -inf), the
        order-preserving keys, and whether it holds a NaN or an infinity (before the reserved ids are
        masked)."""
        ok = ids < V
        x = tl.load(logits_ptr + ids, mask=ok, other=0.0).to(tl.float32)
        bad = tl.sum((ok & ((x != x) | (tl.abs(x) == float("inf")))).to(tl.int32), axis=0) > 0
        blocked = tl.load(blocked_ptr + ids, mask=ok, other=1) != 0
        x = tl.where(blocked, float("-inf"), x)
        scaled = x / tl.where(greedy, 1.0, temp)
        scaled = tl.where(ok, scaled, float("-inf"))
        # the order-preserving key: flip the magnitude bits of negatives (signed int32 order = float order;
        # the unsigned key of the module docstring is this plus 2**31)
        bits = tl.where(scaled == 0.0, 0.0, scaled).to(tl.int32, bitcast=True)
        skey = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        return ok, scaled, skey, bad

    @triton.jit
    def _first_max(v, tv, TAIL: tl.constexpr, VP: tl.constexpr):
        """argmax over the head block v and the tail block tv (indices VP on), the first index on ties."""
        best = tl.argmax(v, axis=0)
        if TAIL:
            tail = tl.argmax(tv, axis=0)
            best = tl.where(tl.max(tv, axis=0) > tl.max(v, axis=0), tail + VP, best)
        return best

    @triton.jit
    def _sample_kernel(logits_ptr, stride_l, blocked_ptr, temp_ptr, top_k_ptr, top_p_ptr, log_noise_ptr, stride_n,
                       code_ptr, stride_code, nonfinite_ptr, keep_ptr, table_ptr, stride_t, next_ptr, stride_next,
                       cond_ptr, uncond_ptr, ref_ptr, H, V, VP: tl.constexpr, VT: tl.constexpr,
                       WRITE_KEEP: tl.constexpr, WRITE_NEXT: tl.constexpr, HP: tl.constexpr, USE_PDL: tl.constexpr):
        """One stream row: ids [0, VP) as the head block and, when VT > 0, [VP, VP + VT) as the tail block
        (`blocks`: 2051 classes as 2048 + 4 lanes). The code goes to code_ptr + s * stride_code; with
        WRITE_NEXT, row `code` of `table` [V, H] (the next depth position's projected input) goes to the
        stream's rows cond_ptr[s], uncond_ptr[s] and ref_ptr[s] (the third row of two guidance scales; the
        uncond row again without one) of `next` [R, H]. USE_PDL: chained (fused.pdl); the
        settings are read before the wait, everything earlier kernels wrote after it."""
        TAIL: tl.constexpr = VT > 0
        s = tl.program_id(0)
        if USE_PDL:
            gdc_launch_dependents()
        temp = tl.load(temp_ptr + s)
        top_k = tl.load(top_k_ptr + s)
        p = tl.load(top_p_ptr + s)
        greedy = temp <= 0.0
        if USE_PDL:
            gdc_wait()
        row = logits_ptr + s * stride_l
        ids = tl.arange(0, VP)
        ok, scaled, skey, bad = _keys(row, blocked_ptr, ids, V, temp, greedy)
        tids = VP + tl.arange(0, VT if TAIL else 1)  # without a tail: one lane past V, masked everywhere
        tok, tscaled, tkey, tbad = _keys(row, blocked_ptr, tids, V, temp, greedy)
        if TAIL:
            bad = bad | tbad
        was = tl.load(nonfinite_ptr + s)
        tl.store(nonfinite_ptr + s, (was != 0) | bad)
        k = tl.where(top_k > 0, tl.minimum(top_k, V), V)
        keep = ok
        tkeep = tok
        if k < V:
            t = _search(skey, ok, scaled, tkey, tok, tscaled, k, False, TAIL, True)
            keep = ok & (skey >= (t - 2147483648).to(tl.int32))
            tkeep = tok & (tkey >= (t - 2147483648).to(tl.int32))
        if p < 1.0:
            kept = tl.where(keep, scaled, float("-inf"))
            tkept = tl.where(tkeep, tscaled, float("-inf"))
            top = tl.max(kept, axis=0)
            if TAIL:
                top = tl.maximum(top, tl.max(tkept, axis=0))
            e = tl.where(keep, tl.exp(kept - top), 0.0)
            te = tl.where(tkeep, tl.exp(tkept - top), 0.0)
            total = tl.sum(e, axis=0)
            if TAIL:
                total += tl.sum(te, axis=0)
            probs = e / total
            tprobs = te / total
            low = tl.full([], -2147483648, tl.int32)
            if _above_row(skey, ok, probs, tkey, tok, tprobs, low, 0, True, TAIL) >= p:  # else all kept are in
                t = _search(skey, ok, probs, tkey, tok, tprobs, p, True, TAIL)
                keep = keep & (skey > (t - 2147483648).to(tl.int32))
                tkeep = tkeep & (tkey > (t - 2147483648).to(tl.int32))
        filtered = tl.where(keep, scaled, float("-inf"))
        tfiltered = tl.where(tkeep, tscaled, float("-inf"))
        log_noise = tl.load(log_noise_ptr + s * stride_n + ids, mask=ok, other=0.0)
        tlog_noise = tl.load(log_noise_ptr + s * stride_n + tids, mask=tok, other=0.0)
        drawn = _first_max(filtered - log_noise, tfiltered - tlog_noise, TAIL, VP)
        best = _first_max(filtered, tfiltered, TAIL, VP)
        code = tl.where(greedy, best, drawn)
        tl.store(code_ptr + s * stride_code, code.to(tl.int64))
        if WRITE_NEXT:
            hs = tl.arange(0, HP)
            hm = hs < H
            # a non-finite row's draw may land on a reserved id; the table has a row for each (the frame is dropped)
            picked = tl.minimum(tl.maximum(code, 0), V - 1).to(tl.int64)
            values = tl.load(table_ptr + picked * stride_t + hs, mask=hm)
            tl.store(next_ptr + tl.load(cond_ptr + s) * stride_next + hs, values, mask=hm)
            tl.store(next_ptr + tl.load(uncond_ptr + s) * stride_next + hs, values, mask=hm)
            tl.store(next_ptr + tl.load(ref_ptr + s) * stride_next + hs, values, mask=hm)
        if WRITE_KEEP:
            tl.store(keep_ptr + s * V + ids, keep.to(tl.int8), mask=ok)
            if TAIL:
                tl.store(keep_ptr + s * V + tids, tkeep.to(tl.int8), mask=tok)


def available(device: torch.device, kernels: fused.KernelSettings = fused.DEFAULT_KERNELS) -> bool:
    """Whether the kernel runs for tensors on `device` (fused.available: CUDA with Triton, or the interpreter)."""
    return fused.available(device, kernels)


def blocks(vocab: int) -> tuple[int, int]:
    """The kernel's two blocks over a row of `vocab` classes (powers of two; the tail 0 when there is none): the
    largest power of two within the row and the rest padded (2051 -> 2048 + 4)."""
    whole = fused._next_power_of_two(vocab)
    if whole == vocab:
        return whole, 0
    head = whole // 2
    return head, fused._next_power_of_two(vocab - head)


def sample(logits: torch.Tensor, rows: RowSampling, blocked: torch.Tensor, log_noise: torch.Tensor,
           nonfinite: torch.Tensor, keep_out: torch.Tensor | None = None, out: torch.Tensor | None = None,
           next_table: torch.Tensor | None = None, next_out: torch.Tensor | None = None,
           cond_row: torch.Tensor | None = None, uncond_row: torch.Tensor | None = None,
           kernels: fused.KernelSettings = fused.DEFAULT_KERNELS, ref_row: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of float32 `logits` [S, V] (int64 [S]; into `out`, which may be strided, e.g. a
    column of the frame's codes); marks `nonfinite` (bool [S]) for rows with a NaN or infinity. `log_noise`
    [S, V] = log of `sampling.exponential_noise` for this position; `blocked` bool [V]. `keep_out` (int8
    [S, V], for tests) receives the filtered set. With `next_table` [V, H]: row `code` of it is also written
    to rows `cond_row[s]`, `uncond_row[s]` and `ref_row[s]` (a stream's third row with two guidance scales;
    None: none has one) of `next_out` [R, H] (FrameStep: the next depth position's input, with no kernel of its
    own). `kernels`: the launch settings (fused.KernelSettings)."""
    streams, vocab = logits.shape
    if log_noise.stride(-1) != 1 or logits.stride(-1) != 1:
        raise ValueError("the sampling kernel needs unit stride along the vocabulary")
    cfg = fused.plan("sample", vocab, kernels)
    head, tail = blocks(vocab)
    code = torch.empty(streams, dtype=torch.int64, device=logits.device) if out is None else out
    keep = keep_out if keep_out is not None else code
    write_next = next_table is not None
    if next_table is not None:
        if next_out is None or cond_row is None or uncond_row is None:
            raise ValueError("next_table needs next_out, cond_row and uncond_row")
        if next_table.shape[0] < vocab or next_table.stride(1) != 1 or next_out.stride(-1) != 1:
            raise ValueError("the next-input table needs a row per class and unit-stride rows")
        if next_table.shape[1] > fused._MAX_WIDTH:
            raise ValueError(f"next-input rows of {next_table.shape[1]} exceed {fused._MAX_WIDTH}")
        table, nxt, width = next_table, next_out.reshape(-1, next_out.shape[-1]), next_table.shape[1]
        cond, uncond = cond_row, uncond_row
        ref = uncond_row if ref_row is None else ref_row
    else:  # unused pointers (never dereferenced)
        table, nxt, width, cond, uncond, ref = logits, logits, 1, code, code, code
    launch = fused._launch(logits.device, kernels)
    _sample_kernel[(streams,)](logits, logits.stride(0), blocked.view(torch.uint8), rows.temperature, rows.top_k,
                               rows.top_p, log_noise, log_noise.stride(0), code, code.stride(0),
                               nonfinite.view(torch.uint8), keep, table, table.stride(0), nxt, nxt.stride(0),
                               cond, uncond, ref, width, vocab, VP=head, VT=tail, WRITE_KEEP=keep_out is not None,
                               WRITE_NEXT=write_next, HP=fused._next_power_of_two(width),
                               num_warps=cfg["num_warps"], **launch)
    return code
