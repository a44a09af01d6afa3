"""The embedded default: the Breeze architecture at tiny sizes with seeded random weights, a tokenizer built
in code, and no download. Used by the worker when no checkpoint is given, by tests, CI and the quick start.
Its audio is not speech: with random weights end of speech comes at ~1/2052 per frame, so requests rely on
their frame limit."""

from __future__ import annotations

import torch

from breeze_worker.model.codec import tiny_codec
from breeze_worker.model.lm.breeze import BreezeLM
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.loaded import GenerationDefaults, LoadedModel
from breeze_worker.model.tokenizer import BreezeTokenizer


def randomize_(lm: BreezeLM, seed: int, std: float = 0.02) -> None:
    """Seeded weights: normal(0, std) for matrices and embeddings, small perturbations of the norm gains."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(lm.named_parameters()):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                base = 0.0 if _gemma_norm(name) else 1.0
                param.copy_(base + 0.1 * noise)
            else:
                param.copy_(std * noise)


def _gemma_norm(name: str) -> bool:
    return name.startswith("text_encoder.")  # Gemma RMSNorm scales by (1 + w)


def tiny_model(seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               config: BreezeConfig | None = None, with_codec: bool = True) -> LoadedModel:
    """The tiny default (`config` overrides the sizes, e.g. for tests); the codec is always FP32."""
    config = config or BreezeConfig.tiny()
    lm = BreezeLM(config)
    randomize_(lm, seed)
    lm = lm.to(device=device, dtype=dtype).eval()
    lm.requires_grad_(False)
    return LoadedModel(config=config, lm=lm, tokenizer=BreezeTokenizer.tiny(config),
                       generation_defaults=GenerationDefaults(),
                       codec=tiny_codec(seed, device, codebook_size=config.codebook_size) if with_codec else None,
                       is_tiny_default=True)
