"""The layer forms: how a `FrameStep` runs its backbone and depth-decoder layers.

A form is an object with `layer()` (one backbone layer step, each row writing its own cache slot) and
`depth_layer()` (one depth-decoder layer step, every row at the same slots), plus the step-wide choices that
go with it. `select_form` picks one per step, once, when the step's units are bound (FrameStep.use_compiled /
use_uncompiled); `fallback` names the form to retry when a form's Triton kernels cannot be built here.

- `fused+chain+all` (compiled, up to FUSED_ROWS model rows: one stream, with or without CFG): the depth
  layers as five chained Triton kernels (fastpath/fused.py `depth_layer`), the backbone's as kernels around
  a compiled attention (`backbone_layer`); the depth input projection and logits as FP32 reductions,
  top-k/top-p by pairwise comparison, each depth position's logits as one kernel (`depth_head`). At one or
  two rows every projection is GEMV-shaped: kernels that read each weight once beat the GEMM library there.
  Fallback: `units+attn`.
- `units+attn` (compiled): every layer as three compiled units whose projections and attention are FP32
  reductions (fastpath/layers.py); no Triton kernel of ours.
- `gemm+attention` (compiled, above FUSED_ROWS): library GEMMs, with the q/k norm, RoPE and cache write as
  fused.qk_norm_rope's kernel, the depth attention as fused.depth_attention's, and the down projection's
  residual added in the GEMM's epilogue; logits from a half-precision GEMM with an FP32 output. With more
  rows the library's tensor-core GEMMs win over per-row reductions. Fallback: `gemm`.
- `gemm`: library GEMMs only; the uncompiled step's form (the backbone's layers as `decode_layer`), and
  compiled the units with each row's cache write scattered in place between them.
"""

from __future__ import annotations

import torch

from breeze_worker.engine.fastpath import fused
from breeze_worker.engine.fastpath.layers import PackedLayer

FUSED_ROWS = 2  # up to this many model rows the automatic choice is `fused+chain+all`


class LayerForm:
    """One way to run the step's layers. `step` is the FrameStep (its units, kernel settings and workspace,
    compiled or not)."""

    name = ""
    fallback: str | None = None  # the form to retry when this one's Triton kernels fail to build
    pairwise_sampling = False  # top-k/top-p filtered by pairwise comparison instead of a sort (few rows)
    small_row_projections = False  # the depth input projection and logits as FP32 reductions
    depth_head_kernel = False  # a depth position's norm, head and CFG as fused.depth_head's kernel
    half_logits = False  # FP32 logits from the half-precision heads through one GEMM (step.half_logits)

    def layer(self, step, layer: PackedLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One backbone layer: x [R, 1, H], cos/sin [R, 1, 1, D], caches [R, kv, L, D], `slots` [R, 1] (each row's
        write position), additive `mask` [R, 1, 1, L]."""
        raise NotImplementedError

    def depth_layer(self, step, layer: PackedLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                    start: int) -> torch.Tensor:
        """One depth-decoder layer at positions start..start+T-1 of x [R, T, H] (every row at the same slots:
        cos/sin [1, 1, T, D], `slots` [1, T], caches [R, kv, 16, D], additive `mask` [1, 1, T, 16])."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<layer form {self.name}>"


class UnitsAttn(LayerForm):
    name = "units+attn"

    def layer(self, step, layer, x, cos, sin, k_cache, v_cache, slots, mask):
        return layer.decode_units(x, cos, sin, k_cache, v_cache, slots, mask, step.units, small_rows=True)

    def depth_layer(self, step, layer, x, cos, sin, k_cache, v_cache, slots, mask, start):
        return layer.decode_units(x, cos, sin, k_cache, v_cache, slots, mask, step.units, small_rows=True,
                                  static_slot=start)


class FusedChainAll(LayerForm):
    name = "fused+chain+all"
    fallback = "units+attn"
    pairwise_sampling = small_row_projections = depth_head_kernel = True

    def layer(self, step, layer, x, cos, sin, k_cache, v_cache, slots, mask):
        if fused.backbone_supported(layer, x.shape[0] * x.shape[1]):
            return fused.backbone_layer(layer, x, cos, sin, k_cache, v_cache, slots, mask, step.units.attend,
                                        step.fused_workspace, step.kernels)
        return UNITS_ATTN.layer(step, layer, x, cos, sin, k_cache, v_cache, slots, mask)

    def depth_layer(self, step, layer, x, cos, sin, k_cache, v_cache, slots, mask, start):
        if fused.supported(layer, x.shape[0] * x.shape[1], k_cache.shape[2], step.kernels):
            return fused.depth_layer(layer, x, cos[0, 0], sin[0, 0], k_cache, v_cache, start, mask,
                                     step.fused_workspace, step.kernels)
        return UNITS_ATTN.depth_layer(step, layer, x, cos, sin, k_cache, v_cache, slots, mask, start)


class Gemm(LayerForm):
    name = "gemm"
    half_logits = True

    def layer(self, step, layer, x, cos, sin, k_cache, v_cache, slots, mask):
        if step.compiled:  # the units, each row's keys/values scattered in place between them (inside one
            # compiled decode_layer Inductor copies the cache slice and back)
            return layer.decode_units(x, cos, sin, k_cache, v_cache, slots, mask, step.units, small_rows=False)
        return layer.decode(x, cos, sin, k_cache, v_cache, slots, mask)

    def depth_layer(self, step, layer, x, cos, sin, k_cache, v_cache, slots, mask, start):
        # every row at the same slot: written in place by the first unit, no scatter
        return layer.decode_units(x, cos, sin, k_cache, v_cache, slots, mask, step.units, small_rows=False,
                                  static_slot=start)


class GemmAttention(LayerForm):
    name = "gemm+attention"
    fallback = "gemm"
    half_logits = True

    def layer(self, step, layer, x, cos, sin, k_cache, v_cache, slots, mask):
        """Norm and q/k/v (library GEMM) as a compiled unit; q/k norm, RoPE and each row's cache write at its
        own slot as fused.qk_norm_rope's one kernel (in place of the unit's norm and RoPE kernels and two
        scatters); attention, output projection, norm, gate/up and SiLU * up as the compiled unit; the down
        projection with the residual in the library GEMM's epilogue."""
        if not fused.qk_norm_rope_supported(layer.head_dim):
            return GEMM.layer(step, layer, x, cos, sin, k_cache, v_cache, slots, mask)
        units = step.units
        proj = units.norm_qkv(x, layer.w_in, layer.qkv, eps_in=layer.eps_in)
        q = fused.qk_norm_rope(proj, layer.qk_norm, layer.qk_eps, cos, sin, k_cache, v_cache, slots,
                               heads=layer.heads, kv_heads=layer.kv_heads, head_dim=layer.head_dim,
                               kernels=step.kernels)
        x, hidden = units.attention_mlp_in(q, k_cache, v_cache, mask, x, layer.attn.o_proj.weight, layer.w_post,
                                           layer.gate_up, scale=layer.scale, eps_post=layer.eps_post,
                                           intermediate=layer.intermediate, act=layer.act, small_rows=False)
        return units.mlp_out_in_place(hidden, x, layer.mlp.down_proj.weight)

    def depth_layer(self, step, layer, x, cos, sin, k_cache, v_cache, slots, mask, start):
        """Norm and q/k/v (library GEMM) as a compiled unit; RoPE and the cache write at `start`
        (fused.qk_norm_rope) and the attention (fused.depth_attention), one kernel each for any row count; the
        output projection, norm, gate/up and SiLU * up as the compiled unit; the down projection with the
        residual in the library GEMM's epilogue."""
        units = step.units
        proj = units.norm_qkv(x, layer.w_in, layer.qkv, eps_in=layer.eps_in)
        q = fused.qk_norm_rope(proj, layer.qk_norm, layer.qk_eps, cos, sin, k_cache, v_cache, slots,
                               heads=layer.heads, kv_heads=layer.kv_heads, head_dim=layer.head_dim,
                               kernels=step.kernels)
        attn = fused.depth_attention(q, k_cache, v_cache, mask, start, scale=layer.scale, kernels=step.kernels)
        x, hidden = units.out_mlp_in(attn, x, layer.attn.o_proj.weight, layer.w_post, layer.gate_up,
                                     eps_post=layer.eps_post, intermediate=layer.intermediate, act=layer.act,
                                     small_rows=False)
        return units.mlp_out_in_place(hidden, x, layer.mlp.down_proj.weight)


UNITS_ATTN, FUSED_CHAIN_ALL, GEMM, GEMM_ATTENTION = UnitsAttn(), FusedChainAll(), Gemm(), GemmAttention()
FORMS: dict[str, LayerForm] = {form.name: form for form in (FUSED_CHAIN_ALL, GEMM_ATTENTION, UNITS_ATTN, GEMM)}


def form_named(name: str) -> LayerForm:
    """The form called `name` (FORMS); a ValueError naming the choices otherwise."""
    form = FORMS.get(name)
    if form is None:
        raise ValueError(f"layer form {name!r}: expected one of {', '.join(FORMS)}")
    return form


def select_form(rows: int, compiled: bool, requested: str = "auto") -> LayerForm:
    """The layer form of a step of `rows` model rows: uncompiled always `gemm`; compiled, `requested` unless
    it is "auto", which takes `fused+chain+all` up to FUSED_ROWS rows and `gemm+attention` above."""
    if not compiled:
        return GEMM
    if requested == "auto":
        return FUSED_CHAIN_ALL if rows <= FUSED_ROWS else GEMM_ATTENTION
    return form_named(requested)


def fallback_of(form: LayerForm) -> LayerForm | None:
    """The form to retry when `form`'s Triton kernels cannot be built (None: retry uncompiled)."""
    return FORMS[form.fallback] if form.fallback else None
