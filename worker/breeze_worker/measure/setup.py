"""What every profiling command needs: common flags, the model to profile, a request, a frame source.

Models: `--model DIR` (a checkpoint), else `--size tiny` (the embedded default, the CPU's size) or `mid` /
`full` (the Breeze architecture with seeded random weights, built by `breeze_worker.measure.models`). Random
weights end speech at random, so `frame_source(..., mask_eos=True)` masks end of speech and every request
runs exactly its frame limit.
"""

from __future__ import annotations

import argparse
import logging

import torch

from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import ResolvedRequest, SynthesisRequest
from breeze_worker.model.loaded import LoadedModel

log = logging.getLogger(__name__)

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog, and the weather today is bright and clear."
INSTRUCTION = "Speak clearly and naturally."
PATHS = ("eager", "fast")


def add_model_arguments(parser: argparse.ArgumentParser, precision: bool = True) -> None:
    parser.add_argument("--model", default=None, metavar="DIR", help="checkpoint directory (default: random weights)")
    parser.add_argument("--size", default="tiny", choices=("tiny", "mid", "full"),
                        help="random-weight model size without --model (tiny = the embedded default)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    if precision:
        parser.add_argument("--precision", default="auto", help="auto | fp32 | bf16 | fp16-mixed")
        parser.add_argument("--force-precision", action="store_true", help="allow a precision this device emulates")
    parser.add_argument("--seed", type=int, default=1234)


def add_request_arguments(parser: argparse.ArgumentParser, frames: int) -> None:
    parser.add_argument("--text", default=DEFAULT_TEXT, help="text to synthesize")
    parser.add_argument("--cfg", action="store_true", help="with CFG (instruction template, scale 2): two rows")
    parser.add_argument("--frames", type=int, default=frames, help="frames per request (end of speech masked)")


def load_model(args: argparse.Namespace, device: torch.device, precision: str | None = None) -> LoadedModel:
    """The model the flags name, in `precision` (default: the --precision flag, fp32 when there is none)."""
    from breeze_worker.engine.precision import choose_policy

    name = precision or getattr(args, "precision", None) or "fp32"
    policy = choose_policy(name, device, force=getattr(args, "force_precision", False))
    if args.model:
        from breeze_worker.measure.models import checkpoint_model

        return checkpoint_model(args.model, device, policy)
    if args.size == "tiny":
        from breeze_worker.engine.precision import apply_policy
        from breeze_worker.model.tiny import tiny_model

        model = tiny_model(seed=args.seed, device=device, with_codec=False)
        apply_policy(model.lm, policy)
        try:  # the codec is only measured when it can be built (the audit and the precision check need none)
            from breeze_worker.model.codec import tiny_codec

            model.codec = tiny_codec(args.seed, device, codebook_size=model.config.codebook_size)
        except Exception as exc:
            log.warning("no codec (%s: %s); codec_decode is not measured", type(exc).__name__, exc)
        return model
    from breeze_worker.measure.models import random_model

    return random_model(args.size, args.seed, device, policy)


def make_request(model: LoadedModel, text: str, cfg: bool, frames: int, seed: int) -> ResolvedRequest:
    req = SynthesisRequest(text=text, instruction=INSTRUCTION if cfg else None, cfg_scale=2.0 if cfg else None,
                           seed=seed, max_frames=frames)
    return resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)


def frame_source(path: str, model: LoadedModel, request: ResolvedRequest, device: torch.device,
                 mask_eos: bool = True, settings=None):
    """An eager or fast frame generator (iterator of int64 [16] frames with `.timings`); `settings`: the fast
    path's (breeze_worker/config.py FastPathSettings; None: the defaults)."""
    if mask_eos:
        from breeze_worker.measure.runner import mask_end_of_speech

        mask_end_of_speech(model)
    if path == "fast":
        from breeze_worker.engine.fastpath.generator import FastFrameGenerator

        return FastFrameGenerator(model, request, device, settings=settings)  # mask_end_of_speech: both paths
    if path != "eager":
        raise ValueError(f"--path must be one of {PATHS}, not {path!r}")
    from breeze_worker.engine.eager import EagerFrameGenerator

    return EagerFrameGenerator(model, request, device)


def parse_paths(value: str) -> list[str]:
    paths = ["eager", "fast"] if value in ("both", "all") else [p for p in value.split(",") if p]
    bad = [p for p in paths if p not in PATHS]
    if bad:
        raise ValueError(f"--path must be eager, fast or both; not {','.join(bad)}")
    return paths


def device_meta(device: torch.device) -> dict:
    from breeze_worker.measure.instruments import device_name

    return {"device": device_name(device), "device_type": device.type, "torch": torch.__version__}
