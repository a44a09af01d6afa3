"""`LoadedModel`: everything the engine needs from a checkpoint (or the tiny default), and its defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from breeze_worker.model.lm.breeze import BreezeLM
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.tokenizer import BreezeTokenizer

FRAME_RATE_HZ = 12.5  # codec frames per second


@dataclass(frozen=True)
class GenerationDefaults:
    """The checkpoint's sampling defaults (generation_config.json; official values where it is silent)
    and the model's limits. The sampling fields mirror `engine.types.SamplingParams`."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.1  # on the codebook-0 history only
    cfg_scale: float = 1.0  # the official default for the templates with a negative branch
    max_frames: int = 1500  # 120 s
    max_sequence: int = 2048  # backbone positions: prompt + frames
    frame_rate: float = FRAME_RATE_HZ

    @classmethod
    def from_generation_config(cls, raw: dict[str, Any]) -> "GenerationDefaults":
        base = cls()

        def pick(key: str, cast, default):
            value = raw.get(key)
            return default if value is None else cast(value)

        return cls(
            temperature=pick("temperature", float, base.temperature),
            top_k=pick("top_k", int, base.top_k),
            top_p=pick("top_p", float, base.top_p),
            repetition_penalty=pick("repetition_penalty", float, base.repetition_penalty),
        )

    def to_generation_config(self) -> dict[str, Any]:
        """generation_config.json as the official checkpoint lays it out (depth keys prefixed)."""
        sampling = {"do_sample": True, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        return {**sampling, **{f"depth_decoder_{k}": v for k, v in sampling.items()},
                "max_new_tokens": self.max_frames}


@dataclass
class LoadedModel:
    config: BreezeConfig
    lm: BreezeLM
    tokenizer: BreezeTokenizer
    generation_defaults: GenerationDefaults
    codec: Any = None  # breeze_worker.model.codec object, None when no codec is available
    is_tiny_default: bool = False

    @property
    def device(self) -> torch.device:
        return self.lm.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.lm_head.weight.dtype
