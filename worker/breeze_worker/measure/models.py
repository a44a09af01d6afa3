"""Models for the engine benchmark: the Breeze architecture at full, mid or tiny size with seeded random
weights built directly on the device (no download), or a real checkpoint directory.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from breeze_worker.engine.precision import PrecisionPolicy, apply_policy
from breeze_worker.model.codec.codec import Codec
from breeze_worker.model.codec.config import CodecConfig, DecoderConfig, released_decoder_config
from breeze_worker.model.codec.decoder import CodecDecoder
from breeze_worker.model.codec.tiny import _draw
from breeze_worker.model.lm.breeze import BreezeLM
from breeze_worker.model.loaded import GenerationDefaults, LoadedModel
from breeze_worker.model.synthetic import config_for
from breeze_worker.model.tokenizer import BreezeTokenizer

log = logging.getLogger(__name__)



@torch.no_grad()
def randomize_on_device(lm: BreezeLM, seed: int, std: float = 0.02) -> None:
    """Seeded normal(0, std) weights drawn on the model's device (norm gains 1 + 0.1 noise, text-encoder
    gains 0.1 noise: Gemma norms scale by 1 + w), the same recipe as the tiny default."""
    device = lm.lm_head.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in sorted(lm.named_parameters()):
        noise = torch.randn(param.shape, generator=gen, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            param.copy_((0.0 if name.startswith("text_encoder.") else 1.0) + 0.1 * noise)
        else:
            param.copy_(std * noise)


def random_model(size: str, seed: int, device: torch.device, policy: PrecisionPolicy,
                 keep_fp32: tuple[str, ...] = (), with_codec: bool = True) -> LoadedModel:
    config = config_for(size)
    with torch.device(device):
        lm = BreezeLM(config)
    lm.reset_buffers()
    randomize_on_device(lm, seed)
    lm.eval().requires_grad_(False)
    apply_policy(lm, policy, keep_fp32)
    codec = _codec(size, seed, device) if with_codec else None
    return LoadedModel(config=config, lm=lm, tokenizer=BreezeTokenizer.tiny(config),
                       generation_defaults=GenerationDefaults(), codec=codec, is_tiny_default=(size == "tiny"))


def _codec(size: str, seed: int, device: torch.device):
    """The tiny codec for the tiny model; otherwise the full-size DECODER with seeded random weights (the
    bench decodes every frame and never encodes, so no encoder is built)."""
    try:
        if size == "tiny":
            from breeze_worker.model.codec import tiny_codec

            return tiny_codec(seed, device)
        return decoder_only_codec(seed, device)
    except Exception as exc:  # the codec is measured when it can be built; the LM numbers stand alone
        log.warning("no codec for the bench (%s: %s); the codec stage is not measured", type(exc).__name__, exc)
        return None


class _NoEncoder(nn.Module):
    """Stands in for the reference encoder of a decoder-only bench codec."""

    def after_load(self) -> None:
        pass

    def encode(self, wav24k):
        raise RuntimeError("the bench codec has no encoder (it only decodes frames)")


@torch.no_grad()
def decoder_only_codec(seed: int, device: torch.device, config: DecoderConfig | None = None) -> Codec:
    """A `Codec` whose decoder has the released sizes (`released_decoder_config()`) and seeded random weights
    drawn by the tiny codec's recipe (same names, same distributions), in FP32 on `device`."""
    decoder_config = config or released_decoder_config()
    with torch.random.fork_rng(devices=[]):
        decoder = CodecDecoder(decoder_config)
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in sorted(decoder.state_dict(keep_vars=True).items()):
        tensor.copy_(_draw(f"decoder.{name}", tensor.shape, generator))
    config_all = CodecConfig(decoder=decoder_config, encoder={"num_quantizers": 32},
                             decode_upsample_rate=decoder_config.samples_per_frame)
    # a module in the encoder's place: the stand-in has the part of its interface Codec uses
    codec = Codec(config_all, decoder.to(device), _NoEncoder())
    return codec


def checkpoint_model(directory: str, device: torch.device, policy: PrecisionPolicy) -> LoadedModel:
    from breeze_worker.model.loader import load_checkpoint

    model = load_checkpoint(directory, device=device, dtype=policy.weight_dtype)
    apply_policy(model.lm, policy)
    return model
