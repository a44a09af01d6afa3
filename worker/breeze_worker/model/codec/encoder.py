"""Reference audio -> codes [T, 16], with transformers' `MimiModel` (encoder half only).

This matches the reference tokenizer's encoding: the 24 kHz waveform goes through Mimi unchanged (its
feature extractor is the identity for one mono clip), the split residual quantizer keeps the first
`encoder_valid_num_quantizers` codebooks (the checkpoint's Mimi has 32; the first 16 do not depend on the
rest), and the codes are trimmed to ceil(samples / 1920) frames.

The checkpoint stores the encoder under `encoder.*` in the flat layout of transformers 4.x
(`encoder.encoder.layers`, `encoder.encoder_transformer`, `encoder.downsample`, `encoder.quantizer`).
transformers up to 5.17 builds `MimiModel` in that same flat layout; later 5.x releases nest the SEANet and
the transformer under `MimiModel.encoder`. `checkpoint_key` maps either layout to the checkpoint's names.

Attention window (a behaviour we chose): the encoder transformer attends causally over the WHOLE clip,
as the reference does on its default eager/SDPA attention path (transformers 4.57 applied Mimi's
`sliding_window` of 250 steps only under flash attention). Up to 250 encoder steps (10 s of audio) the two
agree exactly; for longer references our codes, like the default reference path's, differ from what the
reference produces when run with flash attention. `UNWINDOWED` widens transformers 5's window to keep this.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import MimiConfig, MimiModel

from breeze_worker.errors import CheckpointError
from breeze_worker.logs import route_transformers

log = logging.getLogger(__name__)
route_transformers()  # transformers is imported only here: its records go through the worker's handler

# checkpoint prefix (after "encoder.") -> MimiModel prefix in the nested layout (transformers > 5.17)
_NESTED = (
    ("encoder.layers.", "encoder.encoder_seanet.layers."),
    ("encoder_transformer.", "encoder.encoder_transformer."),
    ("downsample.", "encoder.downsample."),
    ("quantizer.", "quantizer."),
)
# the flat layout (transformers <= 5.17) uses the checkpoint's own names
_FLAT = tuple(old for old, _ in _NESTED)

UNWINDOWED = 1 << 20  # encoder steps (25 Hz): far beyond any reference clip

# keys transformers writes into every config that MimiConfig does not need
_GENERIC_CONFIG_KEYS = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"}


def mimi_config(raw: dict[str, Any]) -> MimiConfig:
    """A transformers `MimiConfig` (encoder half only) from the checkpoint's `encoder_config` block."""
    values = {k: v for k, v in raw.items() if k not in _GENERIC_CONFIG_KEYS and k != "model_type"}
    frame_rate = values.pop("_frame_rate", None)
    if frame_rate is not None:
        values["frame_rate"] = frame_rate
    try:
        config = MimiConfig(**values)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"audio_tokenizer encoder_config is not a valid Mimi config: {exc}") from exc
    config.decoder_config = None  # drop the Mimi decoder half: only encoding is needed
    # The reference (transformers 4.57 Mimi with eager/SDPA attention) masks causally over the whole clip:
    # its `sliding_window` only reached the flash-attention path. transformers 5 applies it everywhere, so
    # widen it past any reference length to encode as the reference does (it matters beyond 250 steps, 10 s).
    config.sliding_window = max(int(config.sliding_window or 0), UNWINDOWED)
    return config


class ReferenceEncoder(nn.Module):
    """Mimi encoder + split residual quantizer; `encode(wav24k) -> int64 [T, valid_quantizers]`."""

    def __init__(self, encoder_config: dict[str, Any], valid_quantizers: int, samples_per_frame: int):
        super().__init__()
        self.mimi_config = mimi_config(encoder_config)
        self.mimi = MimiModel(self.mimi_config)
        # transformers <= 5.17 builds the decoder half as submodules of MimiModel; later versions build it as
        # `decoder` (None here) and keep `upsample` and `decoder_transformer` as deprecated properties that
        # warn when read, so only registered submodules are looked at
        for decoder_part in ("upsample", "decoder_transformer", "decoder"):
            if self.mimi._modules.get(decoder_part) is not None:
                setattr(self.mimi, decoder_part, None)  # encoding never uses them; the checkpoint has none
        self.mimi.eval()
        self.valid_quantizers = valid_quantizers
        self.samples_per_frame = samples_per_frame
        if self.mimi_config.frame_size != samples_per_frame:
            raise CheckpointError(
                f"the Mimi encoder makes a frame every {self.mimi_config.frame_size} samples, "
                f"but the codec expects {samples_per_frame}"
            )

    @staticmethod
    def checkpoint_key(module_key: str) -> str:
        """`mimi.<MimiModel name>` (nested or flat layout) -> `encoder.<checkpoint name>`."""
        inner = module_key.removeprefix("mimi.")
        for checkpoint_prefix, nested_prefix in _NESTED:
            if inner.startswith(nested_prefix):
                return "encoder." + checkpoint_prefix + inner[len(nested_prefix) :]
        if inner.startswith(_FLAT):
            return "encoder." + inner
        raise ValueError(f"no checkpoint name for encoder tensor {module_key!r}")

    def after_load(self) -> None:
        """Drop codebook tables cached from the weights before they were loaded."""
        for module in self.mimi.modules():
            if hasattr(module, "_embed"):
                # a plain attribute of transformers' codebook, outside the Tensor | Module that nn.Module types
                module._embed = None  # type: ignore[assignment]

    @property
    def device(self) -> torch.device:
        return next(self.mimi.parameters()).device

    @torch.no_grad()
    def encode(self, wav: np.ndarray | torch.Tensor) -> torch.Tensor:
        """wav [N] at 24 kHz (any float dtype) -> codes int64 [ceil(N / 1920), valid_quantizers] on the CPU."""
        samples = torch.as_tensor(np.asarray(wav) if not isinstance(wav, torch.Tensor) else wav)
        if samples.dim() != 1 or samples.shape[0] == 0:
            raise ValueError(f"encode expects a non-empty mono waveform [N], got shape {tuple(samples.shape)}")
        samples = samples.to(device=self.device, dtype=torch.float32).view(1, 1, -1)
        codes = self.mimi.encode(samples, num_quantizers=self.valid_quantizers).audio_codes  # [1, K, T']
        frames = math.ceil(samples.shape[-1] / self.samples_per_frame)
        return codes[0, : self.valid_quantizers, :frames].transpose(0, 1).to("cpu", torch.int64).contiguous()
