"""`LoadedModel`: everything the engine needs from a checkpoint (or the tiny default), and its defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from breeze_worker.errors import CheckpointError
from breeze_worker.model.lm.breeze import BreezeLM
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.tokenizer import BreezeTokenizer

FRAME_RATE_HZ = 12.5  # codec frames per second
# the file `breeze-worker make-checkpoint` writes into a synthetic checkpoint (random weights): its presence
# tells the loader that the checkpoint's audio is not speech
SYNTHETIC_NOTICE = "SYNTHETIC.txt"


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
    def from_generation_config(cls, raw: dict[str, Any]) -> GenerationDefaults:
        """Read generation_config.json; an absent or null key keeps the official default, a value of the
        wrong type or range is a `CheckpointError` naming the key (it would otherwise fail every request)."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"generation_config.json must be a JSON object, not {type(raw).__name__}")
        base = cls()

        def pick(key: str, default, want: str, ok) -> Any:
            value = raw.get(key)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not ok(value):
                raise CheckpointError(f"generation_config.json {key} is {value!r}, expected {want}")
            return value

        return cls(
            temperature=float(pick("temperature", base.temperature, "0 (greedy) or a number in [0.001, 100]",
                                   lambda v: v == 0 or 1e-3 <= v <= 100)),
            top_k=int(pick("top_k", base.top_k, "an integer >= 0",
                           lambda v: float(v).is_integer() and 0 <= v < 2**31)),
            top_p=float(pick("top_p", base.top_p, "a number in (0, 1]", lambda v: 0 < v <= 1)),
            repetition_penalty=float(pick("repetition_penalty", base.repetition_penalty, "a number in (0, 1000]",
                                          lambda v: 0 < v <= 1000)),
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
    synthetic: bool = False  # a checkpoint of random weights from make-checkpoint (SYNTHETIC_NOTICE): not speech

    @property
    def device(self) -> torch.device:
        return self.lm.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.lm_head.weight.dtype
