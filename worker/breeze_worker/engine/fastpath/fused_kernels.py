"""The Triton kernels of fastpath/fused.py (that module says what each does, how they chain and why; its
functions launch them with fixed plans and hold the same stages in torch).

Defined only where Triton imports and works: `_triton` is None otherwise, and nothing else here exists.
fastpath/fused_sampling.py builds its kernel from the helpers here and chains it the same way
(`gdc_launch_dependents` / `gdc_wait`).
"""

from __future__ import annotations

import importlib.util
import inspect

_HAS_GDC = False  # griddepcontrol (programmatic dependent launch) in this Triton
_triton = None
if importlib.util.find_spec("triton") is not None:
    try:
        import triton
        import triton.language as tl

        try:  # programmatic dependent launch (Hopper and later): wait for / release the kernels around this one
            from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
            _HAS_GDC = True
        except ImportError:
            gdc_launch_dependents = gdc_wait = None
            _HAS_GDC = False

        @triton.jit
        def _normed_row(x_ptr, w_norm_ptr, row, H, eps, w_ty, HP: tl.constexpr):
            """Row `row` of x [M, H] times rsqrt(mean(x^2) + eps) times the norm weight, rounded to `w_ty`."""
            ks = tl.arange(0, HP)
            k_ok = ks < H
            xv = tl.load(x_ptr + row * H + ks, mask=k_ok, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=0) / H + eps)
            wn = tl.load(w_norm_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            return (xv * rstd * wn).to(w_ty).to(tl.float32)

        @triton.jit
        def _weights(ptrs, mask, EVICT: tl.constexpr):
            """A weight tile as stored (masked lanes 0); EVICT: hinted evict-first (read once per step)."""
            if EVICT:
                return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
            return tl.load(ptrs, mask=mask, other=0.0)

        @triton.jit
        def _add_residual(x_ptr, y_ptr, at, ok, part):
            """y = x + part at offsets `at` (mask `ok`), the projection rounded to y's dtype before the add."""
            out_ty = y_ptr.dtype.element_ty
            xv = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
            tl.store(y_ptr + at, (xv + part.to(out_ty).to(tl.float32)).to(out_ty), mask=ok)

        @triton.jit
        def _last_arrival(count_ptr):
            """Release this program's partial sums of a tile and learn whether it is the tile's last split."""
            return tl.atomic_add(count_ptr, 1, sem="acq_rel")

        @triton.jit
        def _add_splits(ws_ptr, x_ptr, y_ptr, at, ok, split_stride, SPLITS: tl.constexpr):
            """The tile's SPLITS partial sums ws[s * split_stride + at] added in split order, whatever the
            arrival order (the result does not depend on it), then the residual."""
            total = tl.zeros(at.shape, dtype=tl.float32)
            for s in tl.static_range(SPLITS):
                total += tl.load(ws_ptr + s * split_stride + at, mask=ok, other=0.0, cache_modifier=".cg")
            _add_residual(x_ptr, y_ptr, at, ok, total)

        @triton.jit
        def _qkv_rope_kernel(x_ptr, w_norm_ptr, w_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, H, start, eps,
                             stride_cr, stride_ck, stride_cl, M: tl.constexpr, T: tl.constexpr,
                             HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                             BLOCK_P: tl.constexpr, HP: tl.constexpr, USE_PDL: tl.constexpr):
            if USE_PDL:
                gdc_launch_dependents()
            HALF: tl.constexpr = HEAD_DIM // 2
            PER_HEAD: tl.constexpr = HALF // BLOCK_P
            pid = tl.program_id(0)
            head = pid // PER_HEAD
            pairs = (pid % PER_HEAD) * BLOCK_P + tl.arange(0, BLOCK_P)
            ks = tl.arange(0, HP)
            k_ok = (ks < H)[None, :]
            col1 = head * HEAD_DIM + pairs
            w_ty = w_ptr.dtype.element_ty
            out_ty = q_ptr.dtype.element_ty
            # the program's weight rows, loaded once: columns d and d + D/2 of its pairs (RoPE mixes them)
            w1 = tl.load(w_ptr + col1[:, None] * H + ks[None, :], mask=k_ok, other=0.0).to(tl.float32)
            w2 = tl.load(w_ptr + (col1 + HALF)[:, None] * H + ks[None, :], mask=k_ok, other=0.0).to(tl.float32)
            if USE_PDL:  # the weights above do not depend on the kernel before; x and the cache do
                gdc_wait()
            for i in tl.static_range(M):
                r = i // T
                t = i % T
                xn = _normed_row(x_ptr, w_norm_ptr, i, H, eps, w_ty, HP)
                a1 = tl.sum(w1 * xn[None, :], axis=1).to(out_ty).to(tl.float32)  # [BLOCK_P]
                a2 = tl.sum(w2 * xn[None, :], axis=1).to(out_ty).to(tl.float32)
                if head < HEADS + KV_HEADS:  # q and k heads: RoPE, out = x * cos + rotate_half(x) * sin
                    cos1 = tl.load(cos_ptr + t * HEAD_DIM + pairs).to(tl.float32)
                    cos2 = tl.load(cos_ptr + t * HEAD_DIM + HALF + pairs).to(tl.float32)
                    sin1 = tl.load(sin_ptr + t * HEAD_DIM + pairs).to(tl.float32)
                    sin2 = tl.load(sin_ptr + t * HEAD_DIM + HALF + pairs).to(tl.float32)
                    o1 = a1 * cos1 - a2 * sin1
                    o2 = a2 * cos2 + a1 * sin2
                    # q and the cache are pointers of different types where the cache is kept in another
                    # dtype, so each branch stores through its own pointer, rounded to its own dtype
                    if head < HEADS:
                        q_dst = q_ptr + i * (HEADS * HEAD_DIM) + head * HEAD_DIM + pairs
                        tl.store(q_dst, o1.to(out_ty))
                        tl.store(q_dst + HALF, o2.to(out_ty))
                    else:
                        k_dst = k_ptr + r * stride_cr + (head - HEADS) * stride_ck + (start + t) * stride_cl + pairs
                        tl.store(k_dst, o1.to(k_ptr.dtype.element_ty))
                        tl.store(k_dst + HALF, o2.to(k_ptr.dtype.element_ty))
                else:
                    v_dst = (v_ptr + r * stride_cr + (head - HEADS - KV_HEADS) * stride_ck
                             + (start + t) * stride_cl + pairs)
                    tl.store(v_dst, a1.to(v_ptr.dtype.element_ty))
                    tl.store(v_dst + HALF, a2.to(v_ptr.dtype.element_ty))

        @triton.jit
        def _depth_slots(k_ptr, v_ptr, i, kv_head, start, stride_cr, stride_ck, stride_cl, T: tl.constexpr,
                         HEAD_DIM: tl.constexpr, SLOTS: tl.constexpr):
            """Row x position `i`'s keys and values [SLOTS, D] of `kv_head` in FP32, the slots not written yet
            this frame (after start + t) zero, and which slots those are: (keys, values, allowed [SLOTS])."""
            r = i // T
            t = i % T
            d = tl.arange(0, HEAD_DIM)
            slots = tl.arange(0, SLOTS)
            allowed = slots <= start + t
            kv = r * stride_cr + kv_head * stride_ck + slots[:, None] * stride_cl + d[None, :]
            keys = tl.load(k_ptr + kv, mask=allowed[:, None], other=0.0).to(tl.float32)
            vals = tl.load(v_ptr + kv, mask=allowed[:, None], other=0.0).to(tl.float32)
            return keys, vals, allowed

        @triton.jit
        def _depth_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, start, scale, stride_cr, stride_ck, stride_cl,
                                    T: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                                    HEAD_DIM: tl.constexpr, SLOTS: tl.constexpr, USE_PDL: tl.constexpr):
            """One (row, KV head) per program: its GROUP query heads over the layer's SLOTS depth slots, those
            not written yet this frame (after start + t) masked."""
            if USE_PDL:  # everything here reads the kernel before's output
                gdc_launch_dependents()
                gdc_wait()
            GROUP: tl.constexpr = HEADS // KV_HEADS
            i = tl.program_id(0)  # row x position
            g = tl.program_id(1)
            d = tl.arange(0, HEAD_DIM)
            heads = g * GROUP + tl.arange(0, GROUP)
            keys, vals, allowed = _depth_slots(k_ptr, v_ptr, i, g, start, stride_cr, stride_ck, stride_cl, T,
                                               HEAD_DIM, SLOTS)
            q = tl.load(q_ptr + i * (HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + d[None, :]).to(tl.float32)
            s = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [GROUP, SLOTS]
            s = tl.where(allowed[None, :], s, float("-inf"))
            e = tl.exp(s - tl.max(s, axis=1)[:, None])
            val_ty = v_ptr.dtype.element_ty
            p = (e / tl.sum(e, axis=1)[:, None]).to(val_ty).to(tl.float32)
            out = tl.sum(p[:, :, None] * vals[None, :, :], axis=1)  # [GROUP, D]
            tl.store(out_ptr + i * (HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + d[None, :],
                     out.to(out_ptr.dtype.element_ty))

        @triton.jit
        def _depth_attention_head_kernel(q_ptr, k_ptr, v_ptr, out_ptr, start, scale, stride_cr, stride_ck,
                                         stride_cl, T: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                                         HEAD_DIM: tl.constexpr, SLOTS: tl.constexpr, USE_PDL: tl.constexpr):
            """`_depth_attention_kernel` with one (row, query head) per program: more, smaller programs (2-D
            tiles, no [GROUP, SLOTS, D] products) for batched steps; its KV head's keys and values are read
            once per query head of the group (from L2 after the first)."""
            if USE_PDL:
                gdc_launch_dependents()
                gdc_wait()
            GROUP: tl.constexpr = HEADS // KV_HEADS
            i = tl.program_id(0)  # row x position
            head = tl.program_id(1)
            d = tl.arange(0, HEAD_DIM)
            keys, vals, allowed = _depth_slots(k_ptr, v_ptr, i, head // GROUP, start, stride_cr, stride_ck,
                                               stride_cl, T, HEAD_DIM, SLOTS)
            at = i * (HEADS * HEAD_DIM) + head * HEAD_DIM + d
            q = tl.load(q_ptr + at).to(tl.float32)
            s = tl.sum(q[None, :] * keys, axis=1) * scale  # [SLOTS]
            s = tl.where(allowed, s, float("-inf"))
            e = tl.exp(s - tl.max(s, axis=0))
            p = (e / tl.sum(e, axis=0)).to(v_ptr.dtype.element_ty).to(tl.float32)
            out = tl.sum(p[:, None] * vals, axis=0)  # [D]
            tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty))

        @triton.jit
        def _gate_up_tile(w_ptr, cols, ks, H, I, EVICT: tl.constexpr, GATED: tl.constexpr):
            """The weight rows of output columns `cols` (gate, and up when GATED), all H inputs, as stored."""
            w_ok = (cols < I)[:, None] & (ks < H)[None, :]
            wg = _weights(w_ptr + cols[:, None] * H + ks[None, :], w_ok, EVICT)
            wu = wg
            if GATED:
                wu = _weights(w_ptr + (cols + I)[:, None] * H + ks[None, :], w_ok, EVICT)
            return wg, wu

        @triton.jit
        def _gate_up_rows(gf, uf, x_ptr, w_norm_ptr, w_ptr, out_ptr, cols, H, I, eps, M: tl.constexpr,
                          HP: tl.constexpr, GATED: tl.constexpr):
            """Each of the M rows of x normed and reduced against the FP32 tiles gf/uf of columns `cols`:
            SiLU(gate) * up (GATED) or the plain projection, each product rounded to out's dtype first."""
            w_ty = w_ptr.dtype.element_ty
            out_ty = out_ptr.dtype.element_ty
            col_ok = cols < I
            for i in tl.static_range(M):
                xn = _normed_row(x_ptr, w_norm_ptr, i, H, eps, w_ty, HP)
                gate = tl.sum(gf * xn[None, :], axis=1).to(out_ty).to(tl.float32)
                if GATED:
                    up = tl.sum(uf * xn[None, :], axis=1).to(out_ty).to(tl.float32)
                    hidden = gate / (1.0 + tl.exp(-gate)) * up  # SiLU(gate) * up
                    tl.store(out_ptr + i * I + cols, hidden.to(out_ty), mask=col_ok)
                else:
                    tl.store(out_ptr + i * I + cols, gate.to(out_ty), mask=col_ok)

        @triton.jit
        def _norm_gate_up_kernel(x_ptr, w_norm_ptr, w_ptr, out_ptr, H, I, eps, M: tl.constexpr,
                                 BLOCK_N: tl.constexpr, HP: tl.constexpr, EVICT: tl.constexpr,
                                 USE_PDL: tl.constexpr, GATED: tl.constexpr = True):
            """GATED: SiLU(gate) * up over the packed [2I, H] weight; else the plain projection by [I, H]."""
            if USE_PDL:
                gdc_launch_dependents()
            cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
            wg, wu = _gate_up_tile(w_ptr, cols, tl.arange(0, HP), H, I, EVICT, GATED)
            wg = wg.to(tl.float32)
            wu = wu.to(tl.float32)
            if USE_PDL:
                gdc_wait()
            _gate_up_rows(wg, wu, x_ptr, w_norm_ptr, w_ptr, out_ptr, cols, H, I, eps, M, HP, GATED)

        # A prompt's length T (and the slot stride, T or 0) changes with every request. Triton specializes an
        # integer argument on its divisibility by 16, so each class would compile on the first request that
        # meets it, after warm-up (seconds on the first audio); one variant serves every length (where this Triton
        # can leave out only the alignment, T == 1, the decode step, keeps its own). stride_rope (T x head_dim,
        # or 0) is a multiple of 16 whatever T.
        _length_args = ["T", "stride_slot"]
        if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
            _per_length = triton.jit(do_not_specialize_on_alignment=_length_args)
        else:
            _per_length = triton.jit(do_not_specialize=_length_args)

        @_per_length
        def _qk_norm_rope_kernel(p_ptr, qkn_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, eps,
                                 stride_rope, stride_slot, stride_cr, stride_ck, stride_cl, T,
                                 HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                                 HAS_NORM: tl.constexpr, USE_PDL: tl.constexpr):
            """One (row x position, head) per program, from the q/k/v projection p [M, (HEADS + 2 KV) * D]:
            q and k heads RMS-normed with their per-head gains (HAS_NORM), then RoPE; q into its buffer
            [M, HEADS, D], k and v into the caches at the row's slot (slot_ptr [R or 1, T]: per row)."""
            if USE_PDL:
                gdc_launch_dependents()
                gdc_wait()
            HALF: tl.constexpr = HEAD_DIM // 2
            i = tl.program_id(0)
            head = tl.program_id(1)
            r = i // T
            t = i % T
            d = tl.arange(0, HALF)
            ty = q_ptr.dtype.element_ty
            base = p_ptr + i * ((HEADS + 2 * KV_HEADS) * HEAD_DIM) + head * HEAD_DIM
            a1 = tl.load(base + d).to(tl.float32)
            a2 = tl.load(base + HALF + d).to(tl.float32)
            slot = tl.load(slot_ptr + r * stride_slot + t)
            if head < HEADS + KV_HEADS:
                if HAS_NORM:  # as layers.rms_norm: normalized, rounded, times the gain, rounded
                    rstd = 1.0 / tl.sqrt((tl.sum(a1 * a1, axis=0) + tl.sum(a2 * a2, axis=0)) / HEAD_DIM + eps)
                    g1 = tl.load(qkn_ptr + head * HEAD_DIM + d).to(tl.float32)
                    g2 = tl.load(qkn_ptr + head * HEAD_DIM + HALF + d).to(tl.float32)
                    a1 = ((a1 * rstd).to(ty).to(tl.float32) * g1).to(ty).to(tl.float32)
                    a2 = ((a2 * rstd).to(ty).to(tl.float32) * g2).to(ty).to(tl.float32)
                rope = r * stride_rope + t * HEAD_DIM
                cos1 = tl.load(cos_ptr + rope + d).to(tl.float32)
                cos2 = tl.load(cos_ptr + rope + HALF + d).to(tl.float32)
                sin1 = tl.load(sin_ptr + rope + d).to(tl.float32)
                sin2 = tl.load(sin_ptr + rope + HALF + d).to(tl.float32)
                o1 = a1 * cos1 - a2 * sin1
                o2 = a2 * cos2 + a1 * sin2
                # q and the cache are pointers of different types where the cache is kept in another dtype
                # (FP16 beside an FP32 residual stream, engine/precision.py backbone_kv_dtype): each branch
                # stores through its own pointer, rounded once from FP32 to its own dtype (as write_cache)
                if head < HEADS:
                    q_dst = q_ptr + i * (HEADS * HEAD_DIM) + head * HEAD_DIM + d
                    tl.store(q_dst, o1.to(ty))
                    tl.store(q_dst + HALF, o2.to(ty))
                else:
                    k_dst = k_ptr + r * stride_cr + (head - HEADS) * stride_ck + slot * stride_cl + d
                    tl.store(k_dst, o1.to(k_ptr.dtype.element_ty))
                    tl.store(k_dst + HALF, o2.to(k_ptr.dtype.element_ty))
            else:
                v_dst = v_ptr + r * stride_cr + (head - HEADS - KV_HEADS) * stride_ck + slot * stride_cl + d
                tl.store(v_dst, a1.to(v_ptr.dtype.element_ty))
                tl.store(v_dst + HALF, a2.to(v_ptr.dtype.element_ty))

        @triton.jit
        def _down_tile(w_ptr, cols, ks, N, K, EVICT: tl.constexpr):
            """The weights [BLOCK_N, CHUNK] of output columns `cols` over inputs `ks`, as stored."""
            return _weights(w_ptr + cols[:, None] * K + ks[None, :], (cols < N)[:, None], EVICT)

        @triton.jit
        def _down_partials(wf, h_ptr, w_ptr, x_ptr, y_ptr, ws_ptr, cols, ks, split, N, K, M: tl.constexpr,
                           SPLITS: tl.constexpr):
            """Each of the M rows of h against the FP32 tile wf (columns `cols`, inputs `ks`): with one split
            the residual is added at once, else the partial sum goes to the workspace ws [SPLITS, M, N]."""
            w_ty = w_ptr.dtype.element_ty
            col_ok = cols < N
            for i in tl.static_range(M):
                hv = tl.load(h_ptr + i * K + ks).to(w_ty).to(tl.float32)
                part = tl.sum(wf * hv[None, :], axis=1)  # [BLOCK_N]
                if SPLITS == 1:
                    _add_residual(x_ptr, y_ptr, i * N + cols, col_ok, part)
                else:
                    tl.store(ws_ptr + (split * M + i) * N + cols, part, mask=col_ok)

        @triton.jit
        def _down_finish(ws_ptr, count_ptr, x_ptr, y_ptr, cols, N, M: tl.constexpr, SPLITS: tl.constexpr):
            """After a split's partials: the tile's last split to arrive adds them all and resets the counter."""
            if _last_arrival(count_ptr) == SPLITS - 1:
                for i in tl.static_range(M):
                    _add_splits(ws_ptr, x_ptr, y_ptr, i * N + cols, cols < N, M * N, SPLITS)
                tl.atomic_xchg(count_ptr, 0)

        @triton.jit
        def _down_residual_kernel(h_ptr, w_ptr, x_ptr, y_ptr, ws_ptr, count_ptr, N, K, M: tl.constexpr,
                                  BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
                                  EVICT: tl.constexpr, USE_PDL: tl.constexpr):
            if USE_PDL:
                gdc_launch_dependents()
            pid = tl.program_id(0)
            split = tl.program_id(1)
            cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
            ks = split * CHUNK + tl.arange(0, CHUNK)  # K = SPLITS * CHUNK exactly (see `plan`)
            w = _down_tile(w_ptr, cols, ks, N, K, EVICT).to(tl.float32)
            if USE_PDL:  # the partials, counters and outputs are touched only after the kernel before is done
                gdc_wait()
            _down_partials(w, h_ptr, w_ptr, x_ptr, y_ptr, ws_ptr, cols, ks, split, N, K, M, SPLITS)
            if SPLITS > 1:
                _down_finish(ws_ptr, count_ptr + pid, x_ptr, y_ptr, cols, N, M, SPLITS)

        @triton.jit
        def _depth_head_kernel(x_ptr, stride_x, w_norm_ptr, w_ptr, cond_ptr, uncond_ptr, scale_ptr, ref_ptr,
                               ref_scale_ptr, out_ptr, H, V, eps, STREAMS: tl.constexpr, BLOCK_V: tl.constexpr,
                               HP: tl.constexpr, USE_PDL: tl.constexpr):
            """A depth position's stream logits [S, V] in FP32: the final RMSNorm of each of the stream's rows
            (x [R, H], row stride stride_x), times the codebook's head W [H, V] in FP32, CFG-combined
            u + scale * (c - u), or with a third row (ref != uncond: two guidance scales)
            u + ref_scale * (r - u) + scale * (c - u). A program owns BLOCK_V classes and loads their H x BLOCK_V
            weights once."""
            if USE_PDL:
                gdc_launch_dependents()
            pid = tl.program_id(0)
            cols = pid * BLOCK_V + tl.arange(0, BLOCK_V)
            col_ok = cols < V
            ks = tl.arange(0, HP)
            k_ok = ks < H
            w = tl.load(w_ptr + ks[:, None] * V + cols[None, :], mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0).to(tl.float32)  # [HP, BLOCK_V]
            if USE_PDL:  # the weights above do not depend on the kernel before; x does
                gdc_wait()
            w_ty = w_ptr.dtype.element_ty
            for s in tl.static_range(STREAMS):
                cond = tl.load(cond_ptr + s)
                uncond = tl.load(uncond_ptr + s)
                scale = tl.load(scale_ptr + s)
                ref = tl.load(ref_ptr + s)
                xc = _normed_row(x_ptr + cond * stride_x, w_norm_ptr, 0, H, eps, w_ty, HP)
                xu = _normed_row(x_ptr + uncond * stride_x, w_norm_ptr, 0, H, eps, w_ty, HP)
                lc = tl.sum(w * xc[:, None], axis=0)
                lu = tl.sum(w * xu[:, None], axis=0)
                combined = lu
                if ref != uncond:  # only a stream with a third row reads one
                    xr = _normed_row(x_ptr + ref * stride_x, w_norm_ptr, 0, H, eps, w_ty, HP)
                    lr = tl.sum(w * xr[:, None], axis=0)
                    combined = combined + tl.load(ref_scale_ptr + s) * (lr - lu)
                tl.store(out_ptr + s * V + cols, combined + scale * (lc - lu), mask=col_ok)

        _triton = triton
    except Exception:  # an unusable Triton: the torch formulas serve
        _triton = None
