"""How far the half-precision fast paths (bf16, fp16-mixed) agree with the FP32 eager path on one model.

One seeded random model (measure/models.py `random_model`; each policy's copy is built from the same seed, so
its weights are FP32's rounded by the policy), CFG on (scale 2), end of speech masked:

- greedy decoding (temperature 0), free-running: FP32 eager's frames against each fast path's: the first
  (frame, codebook) where they differ, the codes before it, and each codebook's agreement over all frames
  (after the first difference the two run on different histories, so that part is only indicative);
- greedy, teacher-forced on FP32 eager's frames (measure/agreement.py `teacher_forced_logits`): per
  codebook, arg-max agreement, KL(p_fp32 || p_policy) over the drawable classes, non-finite logits;
- sampling (the request's defaults: temperature 0.9, top-k 50, top-p 1), codebook 0 of frame 0 over many
  seeds: each seed's code from each fast path against FP32's exact draw for that seed's noise (the race over
  FP32 eager's logits), so P(same code); and the total variation distance between each path's codes and
  FP32's exact filtered softmax, next to what sampling alone gives for that many draws (quantiles of the TV
  of as many draws from the exact distribution).

Everything is JSON-able; tests/gpu/test_gpu_precision.py asserts on it (full size, CUDA), the CPU suite runs
it on the tiny model.
"""

from __future__ import annotations

import gc
from dataclasses import replace

import torch

from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.fastpath.generator import FastFrameGenerator
from breeze_worker.engine.fastpath.graph import clear_runners
from breeze_worker.engine.precision import make_policy
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.sampling import RowSampling, filter_rows, sample_rows
from breeze_worker.engine.types import EndReason, SamplingOverrides, SynthesisRequest
from breeze_worker.measure.agreement import compare, first_frame_logits, teacher_forced_logits
from breeze_worker.measure.models import random_model
from breeze_worker.measure.runner import INSTRUCTION, SENTENCE, mask_end_of_speech

CFG_SCALE = 2.0
TOP_K_OVERLAP = 50  # the sampler's default top-k: the overlap of the kept sets


def build_model(size: str, policy: str, device: torch.device, seed: int, capacity: int):
    model = random_model(size, seed, device, make_policy(policy, "policy agreement"), with_codec=False)
    model.generation_defaults = replace(model.generation_defaults, max_sequence=capacity)
    mask_end_of_speech(model)
    return model


def request_for(model, seed: int, frames: int, greedy: bool):
    req = SynthesisRequest(text=SENTENCE, instruction=INSTRUCTION, cfg_scale=CFG_SCALE, seed=seed, max_frames=frames,
                           sampling=SamplingOverrides(temperature=0.0) if greedy else None)
    return resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)


def free_running(model, request, device: torch.device, path: str) -> torch.Tensor:
    """The frames [N, 16] of `path` ("eager" or "fast": the fast path as served on `device`)."""
    generator = (EagerFrameGenerator(model, request, device) if path == "eager"
                 else FastFrameGenerator(model, request, device))
    frames = list(generator)
    if generator.end_reason != EndReason.FRAME_LIMIT or len(frames) != request.max_frames:
        raise AssertionError(f"{path} ended with {generator.end_reason} after {len(frames)} frames")
    return torch.stack(frames)


def frame_agreement(reference: torch.Tensor, test: torch.Tensor) -> dict:
    """Free-running frames [N, 16] against the reference's, in generation order (frame by frame, codebook
    0 to 15 within a frame)."""
    same = reference == test
    flat = same.reshape(-1)
    first = int((~flat).nonzero()[0]) if not bool(flat.all()) else None
    books = reference.shape[1]
    per_codebook_first = [int((~same[:, c]).nonzero()[0]) if not bool(same[:, c].all()) else None
                          for c in range(books)]
    return {"frames": int(reference.shape[0]), "identical": first is None,
            "first_divergent_frame": None if first is None else first // books,
            "first_divergent_codebook": None if first is None else first % books,
            "codes_equal_before_divergence": int(flat.numel()) if first is None else first,
            "first_divergent_frame_per_codebook": per_codebook_first,
            "per_codebook_agreement_all_frames": [float(v) for v in same.float().mean(0)]}


def _blocked(model, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Codebook 0's blocked classes (reserved ids, and end of speech: masked here) and the depth heads'."""
    config = model.config
    blocked0 = torch.zeros(config.vocab_size + 1, dtype=torch.bool, device=device)
    blocked0[list(config.reserved_code_ids)] = True
    depth = blocked0[: config.vocab_size].clone()
    blocked0[config.end_of_speech_id] = True
    return blocked0, depth


def teacher_forced(reference: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor],
                   blocked0: torch.Tensor, blocked: torch.Tensor) -> dict:
    """Per codebook (0: the backbone's head, 1-15: the depth heads) over the teacher-forced frames."""
    first = compare(reference[0], test[0], blocked0, TOP_K_OVERLAP)  # [N]
    rest = compare(reference[1], test[1], blocked, TOP_K_OVERLAP)  # [N, 15]
    metric = {key: torch.cat((first[key][:, None].float(), rest[key].float()), dim=1) for key in first}  # [N, 16]
    kl = metric["kl"]
    return {"argmax_agreement_per_codebook": [float(v) for v in metric["top1"].mean(0)],
            "argmax_agreement": float(metric["top1"].mean()),
            "kl_mean": float(kl[torch.isfinite(kl)].mean()) if bool(torch.isfinite(kl).any()) else None,
            "kl_max": float(kl[torch.isfinite(kl)].max()) if bool(torch.isfinite(kl).any()) else None,
            "top50_overlap": float(metric["topk"].mean()),
            "nonfinite_logits": int(metric["nonfinite"].sum())}


def codebook0_draws(model, device: torch.device, seeds: list[int]) -> torch.Tensor:
    """Codebook 0 of frame 0 from the fast path, one request a seed (default sampling): int64 [S]."""
    codes = []
    for seed in seeds:
        frames = free_running(model, request_for(model, seed, 1, greedy=False), device, "fast")
        codes.append(int(frames[0, 0]))
    return torch.tensor(codes)


def exact_codebook0(model, device: torch.device, seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """From the FP32 eager logits of frame 0 (CFG combined): the exact filtered distribution over codebook
    0's classes [V + 1] (float64, CPU), and each seed's draw from them with its own noise (int64 [S], CPU)."""
    request = request_for(model, seeds[0], 1, greedy=False)
    logits = first_frame_logits(model, request)[0]  # [2, V + 1]: the cond and uncond rows
    cond, uncond = logits[0], logits[1]
    combined = (uncond + request.cfg_scale * (cond - uncond))[None].float()
    params = request.sampling
    count = len(seeds)
    rows = RowSampling.from_params([params] * count, seeds, device)
    blocked0, _ = _blocked(model, device)
    blocked0[model.config.end_of_speech_id] = False  # masked by the model's own head already (finite)
    scaled, keep = filter_rows(combined, RowSampling.from_params([params], seeds[:1], device), blocked0)
    probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")).double(), dim=-1)[0]
    draws = sample_rows(combined.expand(count, -1).contiguous(), rows, torch.zeros(count, dtype=torch.int64,
                                                                                   device=device), 0, blocked0)
    return probs.cpu(), draws.cpu()


def total_variation(codes: torch.Tensor, probs: torch.Tensor) -> float:
    empirical = torch.bincount(codes, minlength=probs.numel()).double() / codes.numel()
    return float(0.5 * (empirical - probs).abs().sum())


def null_total_variation(probs: torch.Tensor, draws: int, replicates: int = 2000, seed: int = 0) -> dict:
    """Quantiles of the TV distance between `draws` exact draws and the distribution: sampling noise alone."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.tensor([total_variation(torch.multinomial(probs, draws, replacement=True, generator=generator),
                                           probs) for _ in range(replicates)])
    return {"median": float(values.median()), "q99": float(values.quantile(0.99)),
            "q999": float(values.quantile(0.999)), "replicates": replicates}


def _release(device: torch.device) -> None:
    clear_runners()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(size: str, device: torch.device, policies: tuple[str, ...] = ("bf16", "fp16-mixed"), frames: int = 12,
            seeds: int = 200, model_seed: int = 1234, capacity: int = 256) -> dict:
    """Every figure of the module docstring for `policies` against FP32 (one model at a time on `device`)."""
    seed_list = list(range(1000, 1000 + seeds))
    fp32 = build_model(size, "fp32", device, model_seed, capacity)
    greedy = request_for(fp32, 0, frames, greedy=True)
    eager = free_running(fp32, greedy, device, "eager")
    fast = free_running(fp32, greedy, device, "fast")
    reference_logits = teacher_forced_logits(fp32, greedy, eager)
    probs, exact_draws = exact_codebook0(fp32, device, seed_list)
    fp32_draws = codebook0_draws(fp32, device, seed_list)
    blocked0, blocked = _blocked(fp32, device)
    kept = int((probs > 0).sum())
    doc = {"model": f"random-{size}", "model_seed": model_seed, "cfg_scale": CFG_SCALE, "text": SENTENCE,
           "greedy_frames": frames, "seeds": seeds, "kept_classes": kept,
           "tv_sampling_noise": null_total_variation(probs, seeds),
           "fp32_fast_vs_eager": {"greedy": frame_agreement(eager, fast),
                                  "same_code_as_exact_draw": float((fp32_draws == exact_draws).double().mean()),
                                  "tv_to_exact": total_variation(fp32_draws, probs)},
           "policies": {}}
    del fp32
    _release(device)
    for name in policies:
        model = build_model(size, name, device, model_seed, capacity)
        codes = free_running(model, greedy, device, "fast")
        logits = teacher_forced_logits(model, greedy, eager)
        draws = codebook0_draws(model, device, seed_list)
        doc["policies"][name] = {
            "greedy": frame_agreement(eager, codes),
            "teacher_forced": teacher_forced(reference_logits, logits, blocked0, blocked),
            "same_code_as_fp32": float((draws == exact_draws).double().mean()),
            "same_code_as_fp32_fast": float((draws == fp32_draws).double().mean()),
            "tv_to_exact": total_variation(draws, probs),
        }
        del model, logits
        _release(device)
    return doc
