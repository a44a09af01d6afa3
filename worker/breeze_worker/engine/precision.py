"""Precision policy: which number formats the language model runs in, chosen per device.

| device                         | `auto` gives  | why                                                      |
|--------------------------------|---------------|----------------------------------------------------------|
| CPU                            | `fp32`        | no fast half-precision GEMMs; the numerical reference    |
| CUDA, compute capability < 8.0 | `fp16-mixed`  | BF16 is emulated there (no BF16 tensor cores, unfused SDPA) |
| CUDA, compute capability >= 8.0| `bf16`        | native BF16 tensor cores, the checkpoint's own format    |

Explicit choices: `fp32`, `bf16`, `fp16-mixed`. `bf16` on a device without native BF16 is refused unless
forced: we look at the compute capability, not `torch.cuda.is_bf16_supported()`, which counts emulation.

The `fp16-mixed` recipe (`apply_policy`): FP16 weights and GEMMs (cuBLAS accumulates them in FP32);
everything else in FP32: the residual stream, the norms, attention softmax, the embeddings, the logits
(`lm_head` and `codebooks_head` stay FP32). Any linear layer whose input or output is shown to leave the
FP16 range on an FP32 reference run (`find_overflowing_layers`, forward hooks) is kept in FP32. The codec is
always FP32 (SnakeBeta's `exp` overflows even in BF16); it is not touched here. Its convolutions run in
TF32 where the device has it (`codec_tf32_wanted`: FP32 storage and range, operands rounded to a 10-bit
mantissa on the tensor cores), as the `codec_tf32` setting asks by default; strict FP32 with it off, and
always on a T4 or the CPU.

Everything here is a pure function of (requested name, capability) or of a module, so it is testable on
the CPU with a fake capability.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from breeze_worker.model.lm.breeze import BreezeLM
    from breeze_worker.model.lm.layers import Attention

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16-mixed")
FP16_MAX = 65504.0
# a layer is kept in FP32 when a value it reads or writes comes within this factor of the FP16 maximum on
# the FP32 reference: real inputs vary, and the reference run sees only a few of them
OVERFLOW_MARGIN = 4.0
# linear layers whose outputs are logits: always FP32 under fp16-mixed
LOGIT_LAYERS = ("lm_head",)


class UnsupportedPrecision(ValueError):
    """A precision was asked for that this device cannot run natively (and it was not forced)."""


@dataclass(frozen=True)
class PrecisionPolicy:
    """The formats one model runs in.

    `weight_dtype` is the dtype to load the checkpoint in (FP32 for `fp16-mixed`: `apply_policy` then
    converts the GEMM weights to FP16); `gemm_dtype` is the dtype the matrix products run in.
    """

    name: str  # fp32 | bf16 | fp16-mixed
    weight_dtype: torch.dtype
    gemm_dtype: torch.dtype
    reason: str  # one sentence: why this policy (logged at start-up, reported by the bench)

    @property
    def mixed(self) -> bool:
        return self.name == "fp16-mixed"


_DTYPES = {
    "fp32": (torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp16-mixed": (torch.float32, torch.float16),
}


def make_policy(name: str, reason: str) -> PrecisionPolicy:
    weight_dtype, gemm_dtype = _DTYPES[name]
    return PrecisionPolicy(name=name, weight_dtype=weight_dtype, gemm_dtype=gemm_dtype, reason=reason)


def has_native_bf16(capability: tuple[int, int] | None) -> bool:
    """True on CUDA devices of compute capability 8.0 or newer (Ampere+). None means the CPU."""
    return capability is not None and tuple(capability) >= (8, 0)


def policy_for_capability(capability: tuple[int, int] | None) -> str:
    """The `auto` table: CPU -> fp32, capability < 8.0 -> fp16-mixed, >= 8.0 -> bf16."""
    if capability is None:
        return "fp32"
    return "bf16" if has_native_bf16(capability) else "fp16-mixed"


def resolve_policy(requested: str, capability: tuple[int, int] | None, force: bool = False) -> PrecisionPolicy:
    """Resolve a requested precision (`auto` or an explicit name) for a device of `capability`.

    Raises `UnsupportedPrecision` for `bf16` on a CUDA device below capability 8.0 unless `force`, and for
    half precision on the CPU unless `force`; `ValueError` for an unknown name.
    """
    where = "the CPU" if capability is None else f"a CUDA device of compute capability {capability[0]}.{capability[1]}"
    if requested == "auto":
        name = policy_for_capability(capability)
        return make_policy(name, f"auto: {name} on {where}")
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be auto, {', '.join(PRECISIONS)}; not {requested!r}")
    if requested == "bf16" and capability is not None and not has_native_bf16(capability):
        if not force:
            raise UnsupportedPrecision(
                f"bf16 was asked for on {where}, which has no native BF16 (it would be emulated, several times "
                "slower): use --precision fp16-mixed (or auto), or --force-precision to run emulated BF16 anyway"
            )
        log.warning("running emulated BF16 on %s because it was forced; expect it to be slow", where)
        return make_policy("bf16", f"bf16 forced on {where} (emulated)")
    if requested != "fp32" and capability is None and not force:
        raise UnsupportedPrecision(
            f"{requested} was asked for on the CPU, which has no fast half-precision GEMMs: use --precision fp32 "
            "(or auto), or --force-precision to run it anyway (tests do, to check the recipe)"
        )
    return make_policy(requested, f"{requested} as asked on {where}")


def device_capability(device: torch.device | str) -> tuple[int, int] | None:
    """The compute capability of a CUDA device, None for the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def choose_policy(requested: str, device: torch.device | str, force: bool = False) -> PrecisionPolicy:
    """`resolve_policy` for a real device (reads its compute capability)."""
    return resolve_policy(requested, device_capability(device), force=force)


def codec_tf32_wanted(capability: tuple[int, int] | None, asked: bool) -> bool:
    """TF32 for the codec's convolutions when `asked` (the `codec_tf32` setting, on by default as in PyTorch)
    and the device has it: TF32 exists from compute capability 8.0 on, so a T4 (7.5) or the CPU runs strict
    FP32 whatever is asked."""
    if asked and not has_native_bf16(capability):  # the same hardware line: Ampere's tensor cores
        log.info("codec convolutions in strict FP32: %s has no TF32", "the CPU" if capability is None else
                 f"compute capability {capability[0]}.{capability[1]}")
        return False
    return asked


# ---------------------------------------------------------------- applying a policy to a model


class HalfLinear(nn.Linear):
    """A linear layer whose weight is FP16: its input is cast to FP16 for the GEMM and its output cast
    back to the input's dtype, so the residual stream around it stays FP32. Inside `widened` it computes in
    FP32 instead (the same FP16 weights, upcast exactly): nothing is rounded to FP16, so nothing overflows."""

    widened = False  # set per instance by `widened()` only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.widened:
            bias = None if self.bias is None else self.bias.float()
            return nn.functional.linear(x.float(), self.weight.float(), bias).to(x.dtype)
        out = nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias)
        return out.to(x.dtype)


class Widening:
    """What `widened` saw: the largest magnitude each half-precision layer read or wrote while it computed in
    FP32, kept on the device (no host read per layer) and read once by `first_overflow`."""

    def __init__(self, names: list[str], device: torch.device):
        self.names = names
        self.peaks = torch.zeros(len(names), dtype=torch.float32, device=device)

    def first_overflow(self) -> str | None:
        """The first layer (in model order) whose input or output left FP16's range (or was not finite): where
        the half-precision computation overflowed. None when none did."""
        peaks = self.peaks.tolist()
        return next((name for name, peak in zip(self.names, peaks) if not peak <= FP16_MAX), None)


@contextlib.contextmanager
def widened(model: nn.Module):
    """Inside the block every `HalfLinear` of `model` computes in FP32 from its FP16 weights, and forward hooks
    record each one's largest input and output magnitude (`Widening`). The safe recomputation of a frame whose
    half-precision values went non-finite (engine/fastpath/recovery.py). Single-threaded use: the engine thread
    owns the model."""
    halves = [(n, m) for n, m in model.named_modules() if isinstance(m, HalfLinear)]
    device = next(model.parameters()).device
    record = Widening([n for n, _ in halves], device)
    handles = []
    for index, (_, module) in enumerate(halves):
        module.widened = True

        def peak(_module, inputs, output, index=index):
            seen = torch.maximum(inputs[0].detach().abs().amax().float(), output.detach().abs().amax().float())
            # NaN compares false: store it as infinity so a NaN layer still counts as out of range
            seen = torch.nan_to_num(seen, nan=float("inf"))
            record.peaks[index] = torch.maximum(record.peaks[index], seen)

        handles.append(module.register_forward_hook(peak))
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()
        for _, module in halves:
            del module.widened


def _replace_linear(parent: nn.Module, child_name: str, linear: nn.Linear, dtype: torch.dtype) -> None:
    half = HalfLinear.__new__(HalfLinear)
    nn.Module.__init__(half)
    half.in_features, half.out_features = linear.in_features, linear.out_features
    half.weight = nn.Parameter(linear.weight.detach().to(dtype), requires_grad=False)
    half.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
    setattr(parent, child_name, half)


def apply_policy(model: nn.Module, policy: PrecisionPolicy, keep_fp32: Iterable[str] = ()) -> list[str]:
    """Convert `model` in place to `policy`; returns the names of the linear layers running in half precision.

    fp32 / bf16: every floating tensor in that dtype (bf16 keeps the checkpoint's own format throughout;
    the samplers upcast the logits to FP32).
    fp16-mixed: see the module docstring; `keep_fp32` names extra linear layers (from
    `find_overflowing_layers`) to keep in FP32.
    """
    keep = set(keep_fp32)
    if policy.name in ("fp32", "bf16"):
        model.to(policy.weight_dtype)
        if policy.name == "fp32":
            return []
        return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    model.float()
    converted: list[str] = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear or child_name in LOGIT_LAYERS or full in keep:
                continue
            _replace_linear(module, child_name, child, policy.gemm_dtype)
            converted.append(full)
    if keep:
        log.info("fp16-mixed: %d linear layers kept in FP32 (overflow on the FP32 reference): %s",
                 len(keep), ", ".join(sorted(keep)))
    return converted


def find_overflowing_layers(
    model: nn.Module, run_reference: Callable[[], object], margin: float = OVERFLOW_MARGIN
) -> dict[str, float]:
    """Run `run_reference()` on the FP32 `model` with forward hooks on every linear layer; return the layers
    whose input or output magnitude exceeds FP16_MAX / margin, with the largest magnitude seen."""
    limit = FP16_MAX / margin
    peaks: dict[str, float] = {}

    def hook(name: str):
        def record(_module, inputs, output):
            peak = max(float(inputs[0].detach().abs().max()), float(output.detach().abs().max()))
            if not torch.isfinite(torch.tensor(peak)) or peak > limit:
                peaks[name] = max(peaks.get(name, 0.0), peak)

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        with torch.no_grad():
            run_reference()
    finally:
        for h in handles:
            h.remove()
    return peaks


def half_kv_refusal(lm: BreezeLM) -> str | None:
    """Why the backbone's keys and values cannot be kept in FP16 beside this model's residual stream; None when
    they can (`backbone_kv_dtype`). Decided from the weights alone:

    - values come out of the v projection, a GEMM in FP16 under fp16-mixed: every value is an FP16 number
      already, so storing it in FP16 is exact (not where the start-up probe kept that projection in FP32);
    - keys pass Qwen3's per-head RMSNorm before RoPE: a head of D elements normalizes to a norm of sqrt(D), so
      no key element exceeds sqrt(D) x the largest k-norm gain (RoPE rotates pairs, which keeps their norm);
    - a query meets the keys in FP16 where attention runs as a GEMM, the query pre-scaled by D^-1/2, so a score
      is at most sqrt(D) x the largest q-norm gain x the largest k-norm gain;
    each bound must stay `OVERFLOW_MARGIN` below FP16's maximum."""
    residual = lm.embed_audio_tokens.weight.dtype
    if residual != torch.float32:
        return f"the residual stream is {residual}: the caches already hold its dtype"
    limit = FP16_MAX / OVERFLOW_MARGIN
    for index, layer in enumerate(lm.backbone_model.layers):
        attn = cast("Attention", layer.self_attn)
        if attn.q_norm is None or attn.k_norm is None:
            return f"backbone layer {index} has no q/k norm to bound its keys"
        for name in ("q_proj", "k_proj", "v_proj"):
            projection = getattr(attn, name)
            if not isinstance(projection, HalfLinear) or projection.weight.dtype != torch.float16:
                return f"backbone layer {index}'s {name} does not run in FP16 (kept FP32: its values may not fit)"
        root = attn.head_dim ** 0.5
        key_bound = root * float(attn.k_norm.weight.detach().abs().max())
        score_bound = key_bound * float(attn.q_norm.weight.detach().abs().max())
        if max(key_bound, score_bound) > limit:
            return (f"backbone layer {index}'s q/k norm gains allow keys up to {key_bound:.3g} and scores up to "
                    f"{score_bound:.3g}, within {OVERFLOW_MARGIN:g}x of FP16's limit")
    return None


def backbone_kv_dtype(lm: BreezeLM, half_kv: bool) -> torch.dtype:
    """The backbone KV cache's dtype: the residual stream's, or FP16 beside an FP32 one (fp16-mixed) when
    `half_kv` (the fast path's setting) asks for it and `half_kv_refusal` finds it safe: half the memory per
    stream slot."""
    residual = lm.embed_audio_tokens.weight.dtype
    if not half_kv or residual != torch.float32:
        return residual
    refusal = half_kv_refusal(lm)
    if refusal is not None:
        log.info("backbone KV cache in FP32 beside the FP32 residual stream: %s", refusal)
        return residual
    return torch.float16


def weight_bytes(module: nn.Module) -> int:
    """Bytes the module's parameters and buffers occupy (shared tensors counted once)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = (t.data_ptr(), t.dtype, t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total
