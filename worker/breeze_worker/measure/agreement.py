"""Precision agreement: policies against an FP32 reference on the same weights, teacher-forced.

`precision_check` (`breeze-worker precision-check` and the doctor; the listening page's comparison, rendering.py,
forces its frames through `teacher_forced_logits` and scores them with `agreement`):

1. The FP32 model generates `frames` frames (eager path, end of speech masked): the teacher codes.
2. For each policy, a copy of the FP32 model is converted with engine/precision.py (`apply_policy`; for
   `fp16-mixed` the layers `find_overflowing_layers` flags on the FP32 reference stay FP32), and the
   teacher codes are forced through it: one backbone pass over prompt + frames, one depth-decoder pass
   over every frame's 16 positions. Every model sees the same inputs, so differences are the policy's own.
3. Per frame (step) and codebook, against FP32: KL(p_fp32 || p_policy) of the softmax over the classes the
   sampler can draw (reserved ids masked), whether the arg-max agrees, the overlap of the top-k sets, and
   the number of non-finite logits.

Memory (a 2.85 B-parameter checkpoint is 11.4 GB in FP32, most of a 16 GB T4): everything that needs the FP32
model (teacher codes, reference logits, the overflow scan) runs first; then the FP32 model is moved to the
host, freeing the device, and each policy's model is built from that host copy (copied and converted there,
then moved to the device), checked, and freed before the next one. The device never holds two models.

Policies: `fp32` (the reference against a copy of itself: all zeros), `bf16`, `fp16-mixed` (the serving
policies), `fp16-mixed-kv16` (fp16-mixed with the backbone's keys and values stored in FP16, as the fast path
keeps them where engine/precision.py `half_kv_refusal` allows: rounded on the way into the cache, attention in
FP32 around it) and `fp16` (everything FP16, residual stream and norms included: not a serving policy, shown for
contrast). With `fp16-mixed-kv16` the FP32 reference's largest key and value per backbone layer are reported
(`kv_ranges`) beside the bound the q/k norms put on the keys. A policy this device would refuse is computed
anyway, with the refusal in its `note`; one whose operators fail here is emulated (weights rounded to FP16/BF16,
arithmetic in FP32) and says so.

`precision_agreement` (`breeze-worker bench --agreement`) is the quick form: the first frame alone, no teacher
codes. The backbone prefill of one prompt and the depth decoder's first position pair (codebook 0 forced to 0)
run per row (`first_frame_logits`), and the codebook-0 and codebook-1 logits of a policy's copy are compared with
FP32's: relative L2 error, whether all are finite, whether the arg-max agrees.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
from typing import cast

import torch

from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.precision import (
    FP16_MAX,
    UnsupportedPrecision,
    apply_policy,
    choose_policy,
    find_overflowing_layers,
    half_kv_refusal,
    make_policy,
)
from breeze_worker.engine.prompt import prepare_prompt_embeddings
from breeze_worker.model.lm.layers import Attention, DecoderLayer, KVCache, RoundingKVCache, additive_mask
from breeze_worker.model.loaded import LoadedModel

log = logging.getLogger(__name__)

SCHEMA = "breeze-precision-check/1"
POLICIES = ("fp32", "bf16", "fp16-mixed", "fp16-mixed-kv16", "fp16")
KV16 = "fp16-mixed-kv16"
_HALF = {"bf16": torch.bfloat16, "fp16-mixed": torch.float16, KV16: torch.float16, "fp16": torch.float16}
# per-instance, not weights
_INSTANCE_STATE = ("_fastpath_packed", "backbone_logits", "_bench_eos_masked", "new_backbone_cache")


@contextlib.contextmanager
def eos_masked(model: LoadedModel):
    """End of speech unreachable inside the block (runner.py's mask), restored after."""
    from breeze_worker.measure.runner import mask_end_of_speech

    already = getattr(model.lm, "_bench_eos_masked", False)
    mask_end_of_speech(model)
    try:
        yield model
    finally:
        if not already:
            for name in ("backbone_logits", "_bench_eos_masked"):
                model.lm.__dict__.pop(name, None)


@torch.no_grad()
def teacher_codes(model: LoadedModel, request) -> torch.Tensor:
    """The FP32 model's own frames for `request` (int64 [N, 16], end of speech masked)."""
    with eos_masked(model):
        frames = list(EagerFrameGenerator(model, request))
    return torch.stack(frames)


@torch.no_grad()
def teacher_forced_logits(model: LoadedModel, request, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with `codes` [N, 16] forced: codebook 0 [N, V+1] and codebooks 1..15 [N, 15, V], FP32, CFG rows
    combined u + s*(c - u) as the sampler sees them."""
    lm = model.lm
    prompt = prepare_prompt_embeddings(model, request)
    rows, length, hidden_size = prompt.inputs_embeds.shape
    dtype, device = prompt.inputs_embeds.dtype, prompt.inputs_embeds.device
    codes = codes.to(device)
    n = codes.shape[0]
    fed = lm.embed_frames(codes[: n - 1]).to(dtype)  # frames 0..N-2 are inputs of frames 1..N-1
    embeds = torch.cat((prompt.inputs_embeds, fed[None].expand(rows, -1, -1)), dim=1)
    valid = torch.cat((prompt.attention_mask, torch.ones(rows, n - 1, dtype=torch.bool, device=device)), dim=1)
    steps = torch.arange(1, n, device=device)[None]
    positions = torch.cat((prompt.positions, prompt.positions[:, -1:] + steps), dim=1)
    total = length + n - 1
    causal = torch.ones(total, total, dtype=torch.bool, device=device).tril()
    mask = additive_mask(causal[None, None] & valid[:, None, None, :], dtype)
    hidden = lm.backbone(embeds, positions, mask, lm.new_backbone_cache())[:, length - 1:]  # [R, N, H]
    logits0 = type(lm).backbone_logits(lm, hidden).float()  # the model's own head (not an end-of-speech mask)

    flat = hidden.reshape(rows * n, hidden_size)
    row_codes = codes[None].expand(rows, -1, -1).reshape(rows * n, -1)
    books = row_codes.shape[1]
    parts = [lm.depth_prefill_inputs(flat, row_codes[:, 0])]  # positions 0 (backbone state) and 1 (codebook 0)
    parts += [lm.depth_decoder.code_embedding(row_codes[:, j - 1], j - 1)[:, None] for j in range(2, books)]
    inputs = torch.cat(parts, dim=1)  # [R*N, 16, H]
    depth_mask = additive_mask(torch.ones(books, books, dtype=torch.bool, device=device).tril()[None, None],
                               inputs.dtype)
    depth_hidden = lm.depth_decoder(inputs, torch.arange(books, device=device), depth_mask, lm.new_depth_cache())
    depth = torch.stack([lm.depth_logits(depth_hidden[:, p], p).float() for p in range(1, books)], dim=1)
    depth = depth.reshape(rows, n, books - 1, -1)
    if rows == 2:
        scale = float(request.cfg_scale)
        logits0 = logits0[1] + scale * (logits0[0] - logits0[1])
        depth = depth[1] + scale * (depth[0] - depth[1])
    else:
        logits0, depth = logits0[0], depth[0]
    return logits0, depth


@torch.no_grad()
def first_frame_logits(model: LoadedModel, request) -> tuple[torch.Tensor, torch.Tensor]:
    """(codebook-0 logits [R, V+1], codebook-1 logits [R, V]) of the first frame, codebook 0 forced to 0."""
    lm = model.lm
    prompt = prepare_prompt_embeddings(model, request)
    length = prompt.length
    device = prompt.inputs_embeds.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    allowed = causal[None, None] & prompt.attention_mask[:, None, None, :]
    dtype = prompt.inputs_embeds.dtype
    hidden = lm.backbone(prompt.inputs_embeds, prompt.positions, additive_mask(allowed, dtype),
                         lm.new_backbone_cache())[:, -1]
    logits0 = lm.backbone_logits(hidden)
    rows = hidden.shape[0]
    inputs = lm.depth_prefill_inputs(hidden, torch.zeros(rows, dtype=torch.int64, device=device))
    mask = additive_mask(torch.ones(2, 2, dtype=torch.bool, device=device).tril()[None, None], inputs.dtype)
    depth_hidden = lm.depth_decoder(inputs, torch.arange(2, device=device), mask, lm.new_depth_cache())[:, -1]
    return logits0.float(), lm.depth_logits(depth_hidden, 1).float()


def compare(ref: torch.Tensor, test: torch.Tensor, blocked: torch.Tensor, top_k: int) -> dict[str, torch.Tensor]:
    """Per row of [..., V] logits: KL(ref || test) over unblocked classes, arg-max agreement, top-k overlap,
    non-finite count (of the unblocked test logits)."""
    allowed = ~blocked
    ref, test = ref[..., allowed], test[..., allowed]
    nonfinite = (~torch.isfinite(test)).sum(-1)
    log_p = torch.log_softmax(ref, dim=-1)
    log_q = torch.log_softmax(test, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)
    kl = torch.where(nonfinite > 0, torch.full_like(kl, float("nan")), kl)
    k = min(top_k, ref.shape[-1])
    top_ref = torch.zeros_like(ref, dtype=torch.bool).scatter_(-1, ref.topk(k, dim=-1).indices, True)
    top_test = torch.zeros_like(ref, dtype=torch.bool).scatter_(-1, test.nan_to_num(float("-inf")).topk(
        k, dim=-1).indices, True)
    return {"kl": kl, "top1": (ref.argmax(-1) == test.nan_to_num(float("-inf")).argmax(-1)),
            "topk": (top_ref & top_test).sum(-1).float() / k, "nonfinite": nonfinite}


def logit_error(test: torch.Tensor, ref: torch.Tensor) -> dict:
    """Whole-tensor figures of `test` logits against `ref`: all finite, relative L2 error, arg-max agreement."""
    finite = bool(torch.isfinite(test).all())
    rel = float((test - ref).norm() / ref.norm()) if finite else float("inf")
    return {"finite": finite, "rel_error": rel,
            "argmax_agree": bool(finite and torch.equal(test.argmax(-1), ref.argmax(-1)))}


MASSIVE_LAYER = "backbone_model.layers.0.mlp"


@torch.no_grad()
def inject_massive_activation(model: LoadedModel, scale: float) -> dict:
    """Multiply the first backbone layer's MLP gate and up projections by `scale`, in place: the MLP's inner
    activation (act(gate) * up) grows by about scale^2, and so does what its down projection adds to the
    residual stream. Trained checkpoints carry such massive activations; random weights do not, so this is how
    the check shows where plain FP16 overflows and what fp16-mixed does about it. A stress test, never a
    serving option. Returns what was changed (for the report)."""
    if scale <= 0:
        raise ValueError(f"--massive-activation must be positive, not {scale}")
    layer = model.lm.backbone_model.layers[0]  # an nn.ModuleList item: typed as any Module
    if not isinstance(layer, DecoderLayer):
        raise TypeError(f"the backbone's first layer is a {type(layer).__name__}, not a DecoderLayer")
    mlp = layer.mlp
    mlp.gate_proj.weight.mul_(scale)
    mlp.up_proj.weight.mul_(scale)
    return {"scale": scale, "scaled": [f"{MASSIVE_LAYER}.gate_proj.weight", f"{MASSIVE_LAYER}.up_proj.weight"]}


def activation_peaks(model: LoadedModel, request, codes: torch.Tensor) -> dict[str, float]:
    """The largest magnitude each linear layer of the FP32 model reads or writes under teacher forcing, for the
    layers that come within the overflow finder's margin of the FP16 limit (engine/precision.py)."""
    return find_overflowing_layers(model.lm, lambda: teacher_forced_logits(model, request, codes))


class _RangeCache(KVCache):
    """A growing cache that records the largest key and value magnitude each layer stores."""

    def __init__(self, num_layers: int):
        super().__init__(num_layers)
        self.peaks: list[torch.Tensor | None] = [None] * num_layers

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        peak = torch.stack((key.detach().abs().amax(), value.detach().abs().amax())).float()
        before = self.peaks[layer_idx]
        self.peaks[layer_idx] = peak if before is None else torch.maximum(before, peak)
        return super().update(layer_idx, key, value)


@torch.no_grad()
def kv_ranges(model: LoadedModel, request, codes: torch.Tensor) -> dict:
    """The largest key and value the FP32 model's backbone stores per layer under teacher forcing, beside the
    bound its q/k norms put on any key (sqrt(head_dim) x the largest k-norm gain) and FP16's maximum."""
    lm = model.lm
    cache = _RangeCache(lm.config.backbone.num_hidden_layers)
    lm.new_backbone_cache = lambda: cache  # type: ignore[method-assign]  # this pass only
    try:
        teacher_forced_logits(model, request, codes)
    finally:
        delattr(lm, "new_backbone_cache")
    peaks = [[float(v) for v in p] if p is not None else [0.0, 0.0] for p in cache.peaks]
    root = lm.config.backbone.head_dim ** 0.5
    norms = [cast(Attention, layer.self_attn).k_norm for layer in lm.backbone_model.layers]
    bounds = [None if norm is None else root * float(norm.weight.abs().max()) for norm in norms]
    return {"per_layer": [{"layer": i, "key_max": k, "value_max": v, "key_bound": b}
                          for i, ((k, v), b) in enumerate(zip(peaks, bounds))],
            "key_max": max(k for k, _ in peaks), "value_max": max(v for _, v in peaks),
            "fp16_limit": FP16_MAX, "source": "the FP32 reference's backbone, teacher-forced"}


def _copy(fp32: LoadedModel) -> LoadedModel:
    """A LoadedModel sharing everything with `fp32` but a deep copy of its language model (on its device)."""
    model = copy.copy(fp32)
    model.lm = copy.deepcopy(fp32.lm)
    for stale in _INSTANCE_STATE:
        model.lm.__dict__.pop(stale, None)
    return model


def policy_model(fp32: LoadedModel, name: str, keep_fp32: dict[str, float],
                 device: torch.device | None = None) -> tuple[LoadedModel, str]:
    """A converted copy of the FP32 model, on `device` (default: the FP32 model's); the string says how it was
    made. The copy is made and converted where `fp32` lives (the host, in `precision_check`), then moved."""
    model = _copy(fp32)
    if name == "fp16":
        model.lm.to(torch.float16)
        recipe = "every weight and activation FP16 (residual stream and norms too); logits upcast to FP32"
    else:
        mixed = name in ("fp16-mixed", KV16)
        converted = apply_policy(model.lm, make_policy("fp16-mixed" if mixed else name, "precision-check"),
                                 keep_fp32 if mixed else ())
        recipe = (f"{len(converted)} linear layers FP16, {len(keep_fp32)} kept FP32 for overflow, rest FP32"
                  if mixed else f"apply_policy({name})")
        if name == KV16:
            refusal = half_kv_refusal(model.lm)
            if refusal is None:
                layers = model.lm.config.backbone.num_hidden_layers
                model.lm.new_backbone_cache = (  # type: ignore[method-assign]
                    lambda: RoundingKVCache(layers, torch.float16))
                recipe += "; backbone keys and values stored in FP16"
            else:
                recipe += f"; backbone keys and values stay FP32 (the fast path would refuse FP16: {refusal})"
    if device is not None:
        model.lm.to(device)
    return model, recipe


def emulated_model(fp32: LoadedModel, name: str, device: torch.device | None = None) -> LoadedModel:
    """FP32 arithmetic with every weight rounded to the policy's half type: the weights' share of the error."""
    model = _copy(fp32)
    with torch.no_grad():
        for param in model.lm.parameters():
            param.copy_(param.to(_HALF[name]).float())
    if device is not None:
        model.lm.to(device)
    return model


def release_device_memory(device: torch.device) -> None:
    """Return freed blocks of the caching allocator to the device (after a model is dropped)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def move_to_host(model: LoadedModel) -> torch.device:
    """Move the FP32 language model to the host in place (freeing its device memory); returns the device it
    was on. The codec stays where it is (the check does not use it)."""
    device = model.device
    if device.type != "cpu":
        model.lm.to("cpu")
        release_device_memory(device)
        log.info("precision-check: FP32 reference model moved to the host; policies are built from it one at a time")
    return device


def _device_note(name: str, device: torch.device) -> str | None:
    if name == "fp16":
        return "not a serving policy (shown for contrast)"
    try:
        choose_policy("fp16-mixed" if name == KV16 else name, device, force=False)
    except UnsupportedPrecision:
        return "not native on this device: the worker refuses it without --force-precision; computed anyway"
    return None


def check_policy(fp32: LoadedModel, request, codes, reference, name: str, keep: dict[str, float],
                 blocked0: torch.Tensor, blocked: torch.Tensor, top_k: int, device: torch.device | None = None) -> dict:
    """One policy against the reference logits. `fp32` may live on the host: the policy's model is built from
    it and run on `device` (default: where `fp32` is), then dropped before this returns."""
    device = fp32.device if device is None else device
    out = {"policy": name, "applied": True, "emulated": False, "note": _device_note(name, device),
           "kept_fp32": sorted(keep) if name in ("fp16-mixed", KV16) else [], "recipe": None, "error": None}
    model = None
    try:
        model, out["recipe"] = policy_model(fp32, name, keep, device)
        logits = teacher_forced_logits(model, request, codes)
    except (RuntimeError, NotImplementedError) as exc:  # an operator this device lacks in that dtype
        log.warning("%s failed on %s (%s); emulating it", name, device, exc)
        out.update(emulated=True, error=f"{type(exc).__name__}: {exc}",
                   recipe=f"EMULATED: weights rounded to {_HALF[name]} and back, arithmetic in FP32")
        model = None
        release_device_memory(device)
        try:
            model = emulated_model(fp32, name, device)
            logits = teacher_forced_logits(model, request, codes)
        except (RuntimeError, NotImplementedError) as exc2:
            out.update(applied=False, error=f"{out['error']}; emulation failed too: {exc2}")
            return out
    finally:
        del model  # the policy's model is not needed past its logits
    release_device_memory(device)
    out.update(agreement(reference, logits, blocked0, blocked, top_k))
    return out


def blocked_classes(config, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The classes the sampler never draws (the reserved ids), as masks of codebook 0's classes (with end of
    speech) and of the depth codebooks' classes."""
    blocked = torch.zeros(config.vocab_size + 1, dtype=torch.bool, device=device)
    blocked[list(config.reserved_code_ids)] = True
    return blocked, blocked[:config.vocab_size]


def agreement(reference: tuple[torch.Tensor, torch.Tensor], logits: tuple[torch.Tensor, torch.Tensor],
              blocked0: torch.Tensor, blocked: torch.Tensor, top_k: int) -> dict:
    """Teacher-forced logits (`teacher_forced_logits`) of a model against the reference's, over the same frames:
    `per_step` (each frame, its 16 codebooks), `per_codebook` (over the frames) and `summary`, each with the KL
    mean and max, top-1 agreement, top-k overlap and non-finite counts."""
    ref0, ref_depth = reference
    got0, got_depth = logits
    first = compare(ref0, got0.to(ref0.device), blocked0.to(ref0.device), top_k)  # [N]
    rest = compare(ref_depth, got_depth.to(ref0.device), blocked.to(ref0.device), top_k)  # [N, 15]
    metric = {key: torch.cat((first[key][:, None].float(), rest[key].float()), dim=1) for key in first}  # [N, 16]
    return {
        "per_step": [_summary(metric, slice(t, t + 1), t) for t in range(metric["kl"].shape[0])],
        "per_codebook": [{"codebook": c, **_summary({k: v[:, c:c + 1] for k, v in metric.items()}, slice(None))}
                         for c in range(metric["kl"].shape[1])],
        "summary": _summary(metric, slice(None)),
    }


def _summary(metric: dict[str, torch.Tensor], rows: slice, frame: int | None = None) -> dict:
    kl = metric["kl"][rows]
    finite = kl[torch.isfinite(kl)]
    out: dict[str, float | None] = {"frame": frame} if frame is not None else {}
    out.update({
        "kl_mean": float(finite.mean()) if finite.numel() else None,
        "kl_max": float(finite.max()) if finite.numel() else None,
        "top1_agreement": float(metric["top1"][rows].float().mean()),
        "topk_overlap": float(metric["topk"][rows].mean()),
        "nonfinite": int(metric["nonfinite"][rows].sum()),
        "steps_with_nonfinite": int((metric["nonfinite"][rows] > 0).sum()),
    })
    return out


def precision_check(fp32: LoadedModel, request, policies: list[str], top_k: int = 50,
                    codes_out: list | None = None) -> dict:
    """Teacher codes from `fp32`, then every policy against it; the JSON-able result (`policies` list).
    `codes_out`, if given, receives the teacher codes (int64 [N, 16]: the codec check decodes them).

    Everything that needs the FP32 model runs first; on a GPU the FP32 model is then moved to the host (it
    stays there: `fp32.device` is the CPU afterwards) and each policy's model is built from it in turn."""
    codes = teacher_codes(fp32, request)
    if codes_out is not None:
        codes_out.append(codes)
    reference = teacher_forced_logits(fp32, request, codes)
    config = fp32.config
    keep = {}
    if "fp16-mixed" in policies or KV16 in policies:
        keep = activation_peaks(fp32, request, codes)
    ranges = kv_ranges(fp32, request, codes) if KV16 in policies else None
    device = move_to_host(fp32)  # from here on the device holds one policy's model at a time
    blocked0, blocked = blocked_classes(config, device)
    results = [check_policy(fp32, request, codes, reference, name, keep, blocked0, blocked, top_k, device)
               for name in policies]
    return {"frames": int(codes.shape[0]), "top_k": top_k, "fp16_limit": FP16_MAX,
            "activation_peaks": {name: peak for name, peak in sorted(keep.items())}, "kv_ranges": ranges,
            "policies": results}


def precision_agreement(fp32_model: LoadedModel, request, policy_name: str, find_overflow: bool = True) -> dict:
    """`policy_name` against FP32 on the first frame (`first_frame_logits`): a converted copy of the FP32 model
    (fp16-mixed: with the layers the overflow finder flags on the FP32 reference kept FP32)."""
    ref0, ref1 = first_frame_logits(fp32_model, request)
    keep = {}
    if policy_name == "fp16-mixed" and find_overflow:
        keep = find_overflowing_layers(fp32_model.lm, lambda: first_frame_logits(fp32_model, request))
    test_model, _ = policy_model(fp32_model, policy_name, keep)
    got0, got1 = first_frame_logits(test_model, request)
    return {"policy": policy_name, "kept_fp32": sorted(keep), "codebook0": logit_error(got0, ref0),
            "codebook1": logit_error(got1, ref1)}
