"""The frame step of the fast path, built around rows.

A *row* is one model row (one per stream, two for a CFG stream: cond and uncond, three with two guidance
scales); a *stream* is one request. `FrameStep` owns every buffer a frame reads or writes (static caches,
logits, codes, flags), so its two halves can be captured as CUDA graphs and replayed with no host work in
between:

- `sample_frame()`: codebook 0 from the pending backbone logits (CFG combination, repetition penalty on the
  codebook-0 history, reserved ids masked, temperature / top-k / top-p, exponential race), then the depth
  decoder's 2-position prefill and 14 one-position steps, each with its own sampling. It writes the packed
  host-read buffer `readout` [streams, 18] = 16 codes, end-of-speech flag, non-finite flag.
- `backbone_step(bucket)`: feeds the frame's summed embedding to the backbone (one position per row, written
  at each row's `write_pos`, attending over the first `bucket` slots) and leaves the next frame's logits.

Several streams share one step (engine/batching.py): rows `cond_row[s]`, `uncond_row[s]` of stream `s` are
combined `u + scale * (c - u)`; a stream without CFG has cond_row == uncond_row (exactly c). A stream with
two guidance scales has a third row `ref_row[s]` (the clone prompt's; cond is the instruction prompt's, uncond
the plain prompt's), combined `u + ref_scale * (r - u) + scale * (c - u)`; every other stream has
ref_row == uncond_row and ref_scale 0, which adds exactly 0, so one combination serves one-, two- and
three-row streams in the same step.
Sampling noise is keyed by (seed, frame, codebook) per stream, so the result does not depend on the row
layout. The computation per row is the eager reference's (engine/eager.py), re-expressed with packed GEMMs.

How the layers run is the step's layer form (fastpath/forms.py), chosen once when its units are bound:
`use_uncompiled` (the `gemm` form, plain functions) or `use_compiled` (fastpath/compiled.py), where the
same computation runs through `torch.compile`d units, so each layer's element-wise chains fuse into a few
kernels: the layers' units (one compilation per shape, shared by every layer; fastpath/layers.py), the
frame start (codebook-0 sampling and the depth prefill inputs) and the step between two depth positions
(head, CFG, sampling, next input). Every tensor a unit reads that changes with
the depth position is a separate preallocated tensor of one shape, so the 15 depth steps share one
compilation. The depth decoder attends over all 16 cache slots with a mask (slots not yet written this
frame are blocked), which keeps its shapes constant.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from breeze_worker.config import FastPathSettings
from breeze_worker.engine import tracing
from breeze_worker.engine.fastpath import fused, fused_sampling
from breeze_worker.engine.fastpath.compiled import sampling_kernel_wanted
from breeze_worker.engine.fastpath.forms import GEMM, LayerForm, select_form
from breeze_worker.engine.fastpath.layers import (
    PLAIN_UNITS,
    LayerUnits,
    PackedLayer,
    linear,
    rms_norm,
    small_rows_linear,
)
from breeze_worker.engine.fastpath.static_cache import BackboneCache, DepthCache
from breeze_worker.engine.precision import backbone_kv_dtype
from breeze_worker.engine.sampling import RowSampling, apply_repetition_penalty, frame_noise, sample_rows

READOUT_EOS, READOUT_NONFINITE = 16, 17  # columns of `readout` after the 16 codes


@torch.no_grad()
def projected_codes(lm, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every code's depth input, projected: per codebook p, embed_tokens[p * V:(p + 1) * V] times the input
    projector's weight transposed, [V, depth hidden] in `dtype`; once per model and dtype (16 x 2051 x 1024
    values, 67 MB in BF16 at full size). A depth position then takes its input as one row of this table
    instead of a gather plus a 2048 -> 1024 projection. Computed in float64 and rounded once: the product
    the runtime projection rounds from its FP32 sum (they can differ in the last bit of `dtype`)."""
    cache = getattr(lm, "_fastpath_projected", None)
    if cache is None:
        cache = lm._fastpath_projected = {}
    if dtype not in cache:
        vocab = lm.config.vocab_size
        embed = lm.depth_decoder.model.embed_tokens.weight
        weight = lm.depth_decoder.model.inputs_embeds_projector.weight.double().t()
        cache[dtype] = [(embed[p * vocab:(p + 1) * vocab].double() @ weight).to(dtype)
                        for p in range(lm.config.num_codebooks)]
    return cache[dtype]


_MM_FP32_OUT: dict[tuple, bool] = {}


def half_logits_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `half_logits` runs here: CUDA, a half dtype, and a torch whose `mm` takes `out_dtype` (tried once)."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    key = (str(device), dtype)
    if key not in _MM_FP32_OUT:
        try:
            a = torch.ones(2, 2, dtype=dtype, device=device)
            _MM_FP32_OUT[key] = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_FP32_OUT[key] = False
    return _MM_FP32_OUT[key]


def half_logits(hidden: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """hidden [N, K] @ weight_t [K, V] in FP32, both in one half dtype: each product is exact in FP32 and the
    sums are FP32, the value of `hidden.float() @ weight_t.float()` up to summation order, as one tensor-core
    GEMM with an FP32 output instead of FP32 copies of both and a SIMT GEMM."""
    return torch.mm(hidden, weight_t, out_dtype=torch.float32)


def packed_layers(lm) -> tuple[list[PackedLayer], list[PackedLayer]]:
    """Pack the model's layers once per model (the packing re-points module weights at packed tensors)."""
    packed = getattr(lm, "_fastpath_packed", None)
    if packed is None:
        packed = ([PackedLayer(layer) for layer in lm.backbone_model.layers],
                  [PackedLayer(layer) for layer in lm.depth_decoder.model.layers])
        lm._fastpath_packed = packed
    return packed


class FrameStep:
    def __init__(self, lm, rows: int, streams: int, capacity: int, device: torch.device,
                 settings: FastPathSettings | None = None, sample_kernel: bool | None = None,
                 shared_layers: bool = False):
        """`settings`: the fast path's (None: the defaults); its `kernels` launch every fused kernel of the step.
        `sample_kernel`: whether the sampling kernel draws (None: as `settings.sampler` says for `device`).
        `shared_layers`: caches whose layers share one layer's memory (`scratch`)."""
        cfg = lm.config
        self.settings = settings or FastPathSettings()
        self.kernels = self.settings.kernels
        self.lm, self.rows, self.streams, self.device = lm, rows, streams, device
        self.backbone_layers, self.depth_layers = packed_layers(lm)
        self.codebooks, self.vocab = cfg.num_codebooks, cfg.vocab_size
        dtype = lm.embed_audio_tokens.weight.dtype  # the residual stream's dtype
        self.dtype = dtype
        bb, dd = cfg.backbone, cfg.depth
        # the backbone's keys/values: the residual stream's dtype, or FP16 beside an FP32 one where the weights
        # bound them (precision.backbone_kv_dtype); the depth decoder's 16 positions a row stay in the residual's
        self.cache = BackboneCache.allocate(bb.num_hidden_layers, rows, bb.num_key_value_heads, bb.head_dim,
                                            capacity, backbone_kv_dtype(lm, self.settings.half_kv), device,
                                            shared_layers=shared_layers)
        self.depth_cache = DepthCache.allocate(dd.num_hidden_layers, rows, dd.num_key_value_heads, dd.head_dim,
                                               self.codebooks, dtype, device, shared_layers=shared_layers)
        # depth RoPE: positions 0..15 are the same every frame
        cos, sin = lm.depth_decoder.model.rotary(torch.arange(self.codebooks, device=device), dtype)
        self.depth_cos, self.depth_sin = cos[None, None], sin[None, None]  # [1, 1, 16, D]
        # per depth start position (0: the 2-position prefill; p + 1: codebook p's step): RoPE tables, cache
        # slots and the additive mask over all 16 slots, each its own tensor (constant shapes and alignment)
        n_pos = self.codebooks
        blocked = torch.finfo(torch.float32).min
        self.depth_inputs: dict[int, tuple[torch.Tensor, ...]] = {}
        for start in [0] + list(range(2, n_pos)):
            n = 2 if start == 0 else 1
            query = torch.arange(start, start + n, device=device)[:, None]
            allowed = torch.arange(n_pos, device=device)[None, :] <= query
            mask = torch.where(allowed, 0.0, blocked)[None, None].contiguous()  # [1, 1, n, 16]
            slots = torch.arange(start, start + n, device=device)[None].contiguous()  # [1, n]
            self.depth_inputs[start] = (self.depth_cos[:, :, start:start + n].clone(),
                                        self.depth_sin[:, :, start:start + n].clone(), slots, mask)
        head = lm.depth_decoder.codebooks_head.weight
        self.depth_heads = [head[p - 1] for p in range(1, n_pos)]  # [H, V] per codebook p
        self.depth_projected = projected_codes(lm, dtype)  # [V, depth H] per codebook: the depth inputs
        # the units as plain functions of the step
        self.use_uncompiled(sample_kernel)
        self.fused_workspace = fused.DownWorkspace()  # the fused kernels' split-K partial sums
        # per-row and per-stream state
        self.hidden = torch.zeros(rows, bb.hidden_size, dtype=dtype, device=device)  # last backbone state per row
        # the sampling kernel's next input
        self.next_x = torch.zeros(rows, 1, dd.hidden_size, dtype=dtype, device=device)
        self.logits = torch.zeros(rows, self.vocab + 1, dtype=torch.float32, device=device)  # pending codebook-0 logits
        self.row_stream = torch.zeros(rows, dtype=torch.int64, device=device)
        self.cond_row = torch.zeros(streams, dtype=torch.int64, device=device)
        self.uncond_row = torch.zeros(streams, dtype=torch.int64, device=device)
        self.cfg_scale = torch.ones(streams, dtype=torch.float32, device=device)
        self.ref_row = torch.zeros(streams, dtype=torch.int64, device=device)  # the third row (two scales)
        self.ref_scale = torch.zeros(streams, dtype=torch.float32, device=device)
        self.frame = torch.zeros(streams, dtype=torch.int64, device=device)
        self.seen = torch.zeros(streams, self.vocab + 1, dtype=torch.bool, device=device)  # codebook-0 history
        self.sampling = RowSampling(
            temperature=torch.ones(streams, device=device),
            top_k=torch.zeros(streams, dtype=torch.int64, device=device), top_p=torch.ones(streams, device=device),
            repetition_penalty=torch.ones(streams, device=device),
            seed=torch.zeros(streams, dtype=torch.int64, device=device))
        self.eos_masked = torch.zeros(streams, dtype=torch.bool, device=device)  # bench: end of speech not allowed
        self.codes = torch.zeros(streams, self.codebooks, dtype=torch.int64, device=device)
        self.nonfinite = torch.zeros(streams, dtype=torch.bool, device=device)
        self.readout = torch.zeros(streams, self.codebooks + 2, dtype=torch.int64, device=device)
        reserved = torch.zeros(self.vocab + 1, dtype=torch.bool, device=device)
        reserved[list(cfg.reserved_code_ids)] = True
        self.blocked0 = reserved  # backbone classes: codes, reserved, end of speech (last)
        self.blocked_depth = reserved[: self.vocab].clone()
        self.eos_column = torch.zeros(self.vocab + 1, dtype=torch.bool, device=device)
        self.eos_column[cfg.end_of_speech_id] = True

    # ---- stream setup (host side, outside graphs) ----
    def set_stream(self, stream: int, cond_row: int, uncond_row: int, cfg_scale: float, sampling: RowSampling,
                   eos_masked: bool = False, ref_row: int | None = None, ref_scale: float = 0.0) -> None:
        self.set_streams([StreamSetup(stream, cond_row, uncond_row, cfg_scale, sampling, eos_masked, ref_row,
                                      ref_scale)])

    def set_streams(self, setups: list[StreamSetup]) -> None:
        """Every joiner's slot settings in one write per buffer, with no host sync (`put_rows`): a scalar
        assignment into a device tensor waits for the device each time, a dozen times a joiner. `sampling`:
        one row, on the host or the device."""
        if not setups:
            return
        slots = [u.stream for u in setups]
        refs = [u.uncond_row if u.ref_row is None else u.ref_row for u in setups]
        put_rows(self.cond_row, slots, [u.cond_row for u in setups])
        put_rows(self.uncond_row, slots, [u.uncond_row for u in setups])
        put_rows(self.ref_row, slots, refs)
        put_rows(self.row_stream, [u.cond_row for u in setups] + [u.uncond_row for u in setups] + refs,
                 slots * 3)
        put_rows(self.cfg_scale, slots, [float(u.cfg_scale) for u in setups])
        put_rows(self.ref_scale, slots, [0.0 if u.ref_row is None else float(u.ref_scale) for u in setups])
        for name in ("temperature", "top_k", "top_p", "repetition_penalty", "seed"):
            put_rows(getattr(self.sampling, name), slots, [getattr(u.sampling, name)[0].item() for u in setups])
        put_rows(self.frame, slots, [0] * len(setups))
        put_rows(self.seen, slots, [False] * len(setups))
        put_rows(self.eos_masked, slots, [bool(u.eos_masked) for u in setups])

    @torch.no_grad()
    def prefill(self, rows: slice, embeds: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> None:
        """Run the prompt `embeds` [r, T, H] (left-padded; `allowed` bool [r, T] False on padding, RoPE
        `positions` [r, T]) through the backbone into cache rows `rows`; leaves the first frame's logits."""
        r, t, _ = embeds.shape
        cache = self.cache
        cache.valid[rows] = False
        cache.valid[rows, :t] = allowed
        causal = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()
        mask = torch.where(causal[None] & allowed[:, None, :], 0.0, torch.finfo(torch.float32).min)[:, None]
        cos, sin = self.lm.backbone_model.rotary(positions, self.dtype)
        cos, sin = cos[:, None], sin[:, None]
        x = embeds.to(self.dtype)
        slots = torch.arange(t, device=self.device)[None]  # every row writes slots 0..T-1
        for i, layer in enumerate(self.backbone_layers):
            if layer.decodable and fused.qk_norm_rope_supported(layer.head_dim):  # q/k norm, RoPE, cache write
                x = _prefill_layer(layer, x, cos, sin, cache.key[i, rows], cache.value[i, rows], slots, mask,
                                   self.kernels)
                continue

            def write(k, v, i=i):
                cache.key[i, rows, :, :t] = k
                cache.value[i, rows, :, :t] = v

            def read(i=i):
                return cache.key[i, rows, :, :t], cache.value[i, rows, :, :t]

            x = layer.forward(x, cos, sin, write, read, mask)
        last = self.lm.backbone_model.norm(x[:, -1])
        self.hidden[rows] = last
        self.logits[rows] = self.lm.backbone_logits(last)
        cache.write_pos[rows] = t
        cache.rope_pos[rows] = positions[:, -1] + 1

    # ---- the two graph-captured halves ----
    def _combine(self, logits: torch.Tensor) -> torch.Tensor:
        """Row logits [R, V] -> stream logits [S, V]: u + ref_scale * (r - u) + scale * (c - u) (the reference
        implementation's order of terms; the middle one is exactly 0 for a stream without a third row)."""
        cond, uncond, ref = logits[self.cond_row], logits[self.uncond_row], logits[self.ref_row]
        return uncond + self.ref_scale[:, None] * (ref - uncond) + self.cfg_scale[:, None] * (cond - uncond)

    def _pick(self, logits: torch.Tensor, noise: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        self.nonfinite |= ~torch.isfinite(logits).all(dim=-1)
        # `noise` is this position's, so sample_rows' frame and codebook arguments go unused
        return sample_rows(logits, self.sampling, self.frame, 0, blocked, noise=noise,
                           pairwise=self.form.pairwise_sampling)

    def _sample(self, logits: torch.Tensor, noise: torch.Tensor, log_noise: torch.Tensor | None,
                blocked: torch.Tensor) -> torch.Tensor:
        """One position's codes [S] from its stream logits: the sampling kernel (fastpath/fused_sampling.py)
        or the compiled torch sampler (`_pick`); both also flag non-finite logits."""
        if self.sample_kernel:
            assert log_noise is not None  # the frame start computes it whenever the kernel draws
            return fused_sampling.sample(logits, self.sampling, blocked, log_noise, self.nonfinite,
                                         kernels=self.kernels)
        return self.frame_units.pick(self, logits, noise, blocked)

    def _bind_units(self, wrap) -> None:
        """The frame's units between the layers, each `wrap`ped (compiled or as they are), called with `self`."""
        self.frame_units = SimpleNamespace(**{name.lstrip("_"): wrap(getattr(FrameStep, name)) for name in
                                              ("_frame_start", "_prefill_inputs", "_depth_logits", "_depth_hidden",
                                               "_combine", "_next_projected", "_pick")})

    def use_compiled(self, compile_fn, form: LayerForm | None = None, sample_kernel: bool | None = None) -> None:
        """Run the frame through compiled units (`compile_fn(fn) -> fn`, fastpath/compiled.py); `form`: the
        layers' form (None: `select_form`'s choice for this step's rows and settings); `sample_kernel`: whether
        the sampling kernel draws (None: `sampling_kernel_wanted`)."""
        self.form = form or select_form(self.rows, compiled=True, requested=self.settings.form)
        self.units = LayerUnits.wrapped(compile_fn)
        self._bind_units(compile_fn)
        self.sample_kernel = self._sample_kernel(sample_kernel)
        hidden = self.lm.config.depth.hidden_size
        self.head_kernel = self.form.depth_head_kernel and fused.depth_head_wanted(self.device, hidden, self.kernels)
        self.logits_mm = self.form.half_logits and half_logits_available(self.device, self.dtype)
        self.compiled = True

    def use_uncompiled(self, sample_kernel: bool | None = None) -> None:
        """The units as plain functions of the step (called with `self`, so `narrow` views use them too), in the
        `gemm` form."""
        self.form = GEMM
        self.units = PLAIN_UNITS
        self._bind_units(lambda fn: fn)
        self.sample_kernel = self._sample_kernel(sample_kernel)
        self.head_kernel = False
        self.logits_mm = False
        self.compiled = False

    def _sample_kernel(self, asked: bool | None) -> bool:
        """Whether fastpath/fused_sampling.py draws the codes: `asked`, else as the settings say for the device."""
        return sampling_kernel_wanted(self.device, self.settings) if asked is None else asked

    def _frame_start(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Codebook 0's stream logits (CFG, repetition penalty, the end-of-speech mask) and the frame's noise
        [S, 16, V + 1], with its log when the sampling kernel draws."""
        noise = frame_noise(self.sampling.seed, self.frame, self.codebooks, self.vocab + 1)
        logits0 = apply_repetition_penalty(self._combine(self.logits), self.seen, self.sampling.repetition_penalty)
        # a finite "never" (not -inf): the finiteness check below must only see what the model computed
        logits0 = logits0.masked_fill(self.eos_masked[:, None] & self.eos_column[None, :], -1e30)
        return logits0, noise, torch.log(noise) if self.sample_kernel else None

    def _prefill_inputs(self, code: torch.Tensor) -> torch.Tensor:
        """Codebook 0's code [S] into the history and the frame; the depth prefill inputs, projected [R, 2, H]."""
        self.seen.scatter_(1, code[:, None], True)
        self.codes[:, 0] = code
        # depth decoder: position 0 = backbone state, 1 = codebook-0 embedding (a 2-position prefill)
        row_code = code[self.row_stream].clamp(max=self.vocab - 1)
        x = self.lm.depth_prefill_inputs(self.hidden, row_code)
        return self._project(x.to(self.dtype))

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """The depth decoder's input projection (2048 -> 1024), as a small-row reduction where the form says so
        (at a few rows the GEMM library's kernel reads the weight well below bandwidth)."""
        weight = self.lm.depth_decoder.model.inputs_embeds_projector.weight
        if self.form.small_row_projections:
            return small_rows_linear(x, weight)
        return linear(x, weight)

    def _depth_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The depth layers' output at the last position, final-normed: [R, H]."""
        dm = self.lm.depth_decoder.model
        return rms_norm(x[:, -1], dm.norm.weight, dm.norm.eps)

    def _depth_logits(self, x: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """From the depth layers' output at the last position: codebook p's stream logits (`head` [H, V], CFG)."""
        hidden = self._depth_hidden(x)
        if self.form.small_row_projections:  # the same FP32 product as a reduction (no FP32 copy of the head, no SGEMM)
            logits = small_rows_linear(hidden.float(), head.t())
        else:
            logits = hidden.float() @ head.float()
        return self._combine(logits)

    def _next_projected(self, code: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """The next depth position's projected input from codebook p's codes: rows of `projected_codes` (one
        gather, no projection)."""
        return F.embedding(code[self.row_stream], table)[:, None]

    @torch.no_grad()
    def sample_frame(self) -> None:
        """Trace spans (engine/tracing.py; only when not graph-captured): sampling (codebook 0, with the depth
        prefill inputs), depth_steps > depth_step (codebook p's position), sampling (codebooks 1..15)."""
        lm, device, units = self.lm, self.device, self.frame_units
        # the depth inputs from `projected_codes` (the sampling kernel writes them itself); uncompiled without
        # the kernel, the model's own embedding and projection (tests patch them)
        from_table = self.sample_kernel or self.compiled
        kernel_writes_next = self.sample_kernel and from_table  # the code into its column, the input into next_x
        self.nonfinite.zero_()
        with tracing.device_span(device, "sampling", codebook=0):
            logits0, noise, log_noise = units.frame_start(self)
            code = self._sample(logits0, noise[:, 0], None if log_noise is None else log_noise[:, 0], self.blocked0)
            x = units.prefill_inputs(self, code)
        with tracing.device_span(device, "depth_steps"):
            with tracing.device_span(device, "depth_step", codebook=1):  # the 2-position prefill
                x = self._depth(x, 0)
            for p in range(1, self.codebooks):
                with tracing.device_span(device, "sampling", codebook=p):
                    if self.head_kernel:  # norm, head, CFG as one kernel
                        dm = lm.depth_decoder.model
                        logits = fused.depth_head(x[:, -1], dm.norm.weight, dm.norm.eps, self.depth_heads[p - 1],
                                                  self.cond_row, self.uncond_row, self.cfg_scale, self.kernels,
                                                  ref_row=self.ref_row, ref_scale=self.ref_scale)
                    elif self.logits_mm and self.depth_heads[p - 1].dtype == self.dtype:
                        hidden = units.depth_hidden(self, x)
                        logits = units.combine(self, half_logits(hidden, self.depth_heads[p - 1]))
                    elif self.compiled:
                        logits = units.depth_logits(self, x, self.depth_heads[p - 1])
                    else:  # the model's own head method (tests patch it)
                        dm = lm.depth_decoder.model
                        logits = self._combine(lm.depth_logits(rms_norm(x[:, -1], dm.norm.weight, dm.norm.eps), p))
                    last = p + 1 == self.codebooks
                    if kernel_writes_next:
                        code = fused_sampling.sample(
                            logits, self.sampling, self.blocked_depth, log_noise[:, p, : self.vocab],
                            self.nonfinite, out=self.codes[:, p],
                            next_table=None if last else self.depth_projected[p], next_out=self.next_x,
                            cond_row=self.cond_row, uncond_row=self.uncond_row, kernels=self.kernels,
                            ref_row=self.ref_row)
                    else:
                        code = self._sample(logits, noise[:, p, : self.vocab],
                                            None if log_noise is None else log_noise[:, p, : self.vocab],
                                            self.blocked_depth)
                        self.codes[:, p] = code
                if p + 1 < self.codebooks:
                    # codebook p's code sits at depth position p + 1 (embedding offset p * vocab)
                    with tracing.device_span(device, "depth_step", codebook=p + 1):
                        if kernel_writes_next:
                            nxt = self.next_x
                        elif from_table:
                            nxt = units.next_projected(self, code, self.depth_projected[p])
                        else:  # the model's own embedding method (tests patch it)
                            embed = lm.depth_decoder.code_embedding(code[self.row_stream], p)[:, None]
                            nxt = linear(embed.to(self.dtype), lm.depth_decoder.model.inputs_embeds_projector.weight)
                        x = self._depth(nxt, p + 1)
        self.frame.add_(1)
        self.readout[:, : self.codebooks] = self.codes
        self.readout[:, READOUT_EOS] = (self.codes[:, 0] == self.lm.config.end_of_speech_id).long()
        self.readout[:, READOUT_NONFINITE] = self.nonfinite.long()

    def _depth(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Depth layers at positions from `start` (0: the 2-position prefill); x projected [R, n, H]."""
        cos, sin, slots, mask = self.depth_inputs[start]
        cache = self.depth_cache
        for i, layer in enumerate(self.depth_layers):
            x = self.form.depth_layer(self, layer, x, cos, sin, cache.key[i], cache.value[i], slots, mask, start)
        return x

    @torch.no_grad()
    def backbone_step(self, bucket: int) -> None:
        """Feed the sampled frame to the backbone; attend over the first `bucket` cache slots."""
        lm, cache = self.lm, self.cache
        codes = self.codes[self.row_stream].clamp(max=self.vocab - 1)
        x = lm.embed_frames(codes)[:, None].to(self.dtype)  # [R, 1, H]
        cache.mark_written()
        mask = torch.where(cache.step_mask(bucket), 0.0, torch.finfo(torch.float32).min)
        cos, sin = lm.backbone_model.rotary(cache.rope_pos[:, None], self.dtype)
        cos, sin = cos[:, None], sin[:, None]
        slots = cache.write_pos[:, None]
        for i, layer in enumerate(self.backbone_layers):
            x = self.form.layer(self, layer, x, cos, sin, cache.key[i, :, :, :bucket], cache.value[i, :, :, :bucket],
                                slots, mask)
        norm = lm.backbone_model.norm
        last = rms_norm(x[:, -1], norm.weight, norm.eps)
        self.hidden.copy_(last)
        if self.logits_mm and lm.lm_head.weight.dtype == last.dtype:
            self.logits.copy_(half_logits(last, lm.lm_head.weight.t()))
        else:
            self.logits.copy_(lm.backbone_logits(last))
        cache.advance()


    # ---- batching (engine/batching.py): prefix views and freeing rows; additive, host side ----
    def narrow(self, rows: int, streams: int) -> FrameStep:
        """A FrameStep over the first `rows` rows and `streams` streams that SHARES this step's buffers (views,
        no copies): the batched engine captures one graph per (streams, rows) bucket on one static cache.
        Every per-row and per-stream buffer allocated in __init__ must be listed here."""
        if not (0 < rows <= self.rows and 0 < streams <= self.streams):
            raise ValueError(f"narrow({rows}, {streams}) outside {self.rows} rows / {self.streams} streams")
        view = copy.copy(self)
        view.rows, view.streams = rows, streams
        view.use_uncompiled()  # rebind the units to the view (compile the view itself if wanted)
        c, d = self.cache, self.depth_cache
        view.cache = BackboneCache(key=c.key[:, :rows], value=c.value[:, :rows], valid=c.valid[:rows],
                                   write_pos=c.write_pos[:rows], rope_pos=c.rope_pos[:rows])
        view.depth_cache = DepthCache(key=d.key[:, :rows], value=d.value[:, :rows])
        for name in ("hidden", "next_x", "logits", "row_stream"):
            setattr(view, name, getattr(self, name)[:rows])
        for name in ("cond_row", "uncond_row", "cfg_scale", "ref_row", "ref_scale", "frame", "seen", "eos_masked",
                     "codes", "nonfinite", "readout"):
            setattr(view, name, getattr(self, name)[:streams])
        s = self.sampling
        view.sampling = RowSampling(temperature=s.temperature[:streams], top_k=s.top_k[:streams],
                                    top_p=s.top_p[:streams], repetition_penalty=s.repetition_penalty[:streams],
                                    seed=s.seed[:streams])
        return view

    def scratch(self, rows: int, streams: int) -> FrameStep:
        """A step of `rows` rows and `streams` streams with buffers of its own, on which the compiled code of
        `narrow(rows, streams)` can be compiled and warmed while streams use this step's buffers: every tensor
        a unit sees there has the shape and strides of the view's (a prefix of a per-row or per-stream buffer
        has the strides of a buffer of the prefix's size; a layer of a cache, those of a cache of its rows),
        and its caches give every layer one layer's memory (`BackboneCache.allocate`'s `shared_layers`). Its
        units must be bound as the view's are (`use_compiled` with the same form, or `use_uncompiled`)."""
        return FrameStep(self.lm, rows=rows, streams=streams, capacity=self.cache.capacity, device=self.device,
                         settings=self.settings, shared_layers=True)

    def scrub(self, rows: list[int] | None = None, backbone: bool = True) -> None:
        """Zero the keys/values of `rows` (all when None) in both caches (`backbone` False: the depth decoder's
        only, which restarts every frame). After a step computed non-finite values for a row, its slots hold
        them; a later occupant's attention reads every slot of its bucket, and a masked NaN is still NaN
        (NaN + mask), so the next request on these rows would fail too."""
        index = slice(None) if rows is None else torch.as_tensor(rows, dtype=torch.long, device=self.device)
        for cache in (self.cache, self.depth_cache) if backbone else (self.depth_cache,):
            cache.key[:, index] = 0
            cache.value[:, index] = 0

    def release(self, stream: int | None, rows: list[int]) -> None:
        """Park a finished stream's slot and rows (or idle rows only, stream None): they stay inside graphs'
        row prefixes, so every index they hold must stay in range (rows -> stream 0, stream -> row 0) and
        their cache position restarts at 0. No host sync (`put_rows`)."""
        if stream is not None:
            put_rows(self.cond_row, [stream], [0])
            put_rows(self.uncond_row, [stream], [0])
            put_rows(self.cfg_scale, [stream], [1.0])
            put_rows(self.ref_row, [stream], [0])
            put_rows(self.ref_scale, [stream], [0.0])
        rows = list(rows)
        if rows:
            put_rows(self.row_stream, rows, [0] * len(rows))
            put_rows(self.cache.valid, rows, [False] * len(rows))
            put_rows(self.cache.write_pos, rows, [0] * len(rows))
            put_rows(self.cache.rope_pos, rows, [0] * len(rows))


@dataclass
class StreamSetup:
    """One stream's slot settings (FrameStep.set_streams)."""

    stream: int
    cond_row: int
    uncond_row: int
    cfg_scale: float
    sampling: RowSampling  # one row
    eos_masked: bool = False
    ref_row: int | None = None  # the third row of two guidance scales (the clone prompt's); None: none
    ref_scale: float = 0.0  # its scale (cfg_scale is then the instruction prompt's)


def stream_setup(stream: int, rows: list[int], request, sampling: RowSampling, eos_masked: bool = False) -> StreamSetup:
    """The slot settings of a request (engine/types.py ResolvedRequest) whose branches sit in `rows`, in the
    order of its prompt layouts (engine/prompt.py `lay_out`): [prompt], [prompt, negative], or with two
    guidance scales [instruction, clone, plain]."""
    if len(rows) != request.branches:
        raise ValueError(f"a request with {request.branches} branch(es) was given {len(rows)} row(s)")
    if request.dual_cfg:
        return StreamSetup(stream, cond_row=rows[0], uncond_row=rows[2], cfg_scale=float(request.cfg_scale_instruction),
                           sampling=sampling, eos_masked=eos_masked, ref_row=rows[1],
                           ref_scale=float(request.cfg_scale_reference))
    return StreamSetup(stream, cond_row=rows[0], uncond_row=rows[-1], cfg_scale=float(request.cfg_scale),
                       sampling=sampling, eos_masked=eos_masked)


def put_rows(buffer: torch.Tensor, index: list[int], values: list) -> None:
    """buffer[index[i]] = values[i] (a row of `buffer` takes its scalar throughout) without a host sync: on
    CUDA the index and values travel in one asynchronous copy each from pinned host memory, then one
    index_copy_. A repeated index must carry the same value."""
    cuda = buffer.device.type == "cuda"
    idx = torch.tensor(index, dtype=torch.int64)
    val = torch.tensor(values, dtype=buffer.dtype)
    if cuda:
        idx = idx.pin_memory().to(buffer.device, non_blocking=True)
        val = val.pin_memory().to(buffer.device, non_blocking=True)
    val = val.view(-1, *([1] * (buffer.dim() - 1))).expand(len(index), *buffer.shape[1:])
    buffer.index_copy_(0, idx, val.contiguous())


def _prefill_layer(layer: PackedLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                   kernels: fused.KernelSettings) -> torch.Tensor:
    """`PackedLayer.forward` over a prompt x [R, T, hidden] with its q/k norm, RoPE and cache write (slots [1, T]
    into k_cache/v_cache [R, kv, L, D]) as fused.qk_norm_rope's one kernel, in place of ~10 element-wise
    kernels a layer over the heads-first (strided) view of the projection; on the CPU the kernel's fallback is
    that same arithmetic."""
    t = x.shape[1]
    assert layer.qkv is not None  # called for decodable layers only (packed q/k/v)
    proj = linear(rms_norm(x, layer.w_in, layer.eps_in), layer.qkv)
    q = fused.qk_norm_rope(proj, layer.qk_norm, layer.qk_eps, cos, sin, k_cache, v_cache, slots, heads=layer.heads,
                           kv_heads=layer.kv_heads, head_dim=layer.head_dim, kernels=kernels)
    return layer.attend_then_mlp(x, q, k_cache[:, :, :t], v_cache[:, :, :t], mask)
