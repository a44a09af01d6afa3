"""`audio_tokenizer/` (config.json + model.safetensors) -> `Codec`, streaming tensors one at a time.

The decoder is built on the meta device and materialized on the target device, so no random
initialization is spent on it; each checkpoint tensor is read and copied into place in turn. Every tensor
must match by name and shape: a mismatch raises `CheckpointError` naming what to look at.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open

from breeze_worker.errors import CheckpointError
from breeze_worker.model.codec.codec import Codec, require_fp32
from breeze_worker.model.codec.config import CodecConfig
from breeze_worker.model.codec.decoder import CodecDecoder
from breeze_worker.model.codec.encoder import ReferenceEncoder

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def read_codec_config(audio_tokenizer_dir: str | Path) -> CodecConfig:
    path = Path(audio_tokenizer_dir) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"codec config not found: {path} (expected the checkpoint's audio_tokenizer/ folder)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    return CodecConfig.from_dict(raw)


def build_codec_modules(config: CodecConfig, device: torch.device | str) -> tuple[CodecDecoder, ReferenceEncoder]:
    """Decoder (uninitialized memory) and encoder (random init) on `device`, ready to receive weights."""
    with torch.device("meta"):
        decoder = CodecDecoder(config.decoder)
    decoder.to_empty(device=device)
    with torch.device(device):
        encoder = ReferenceEncoder(
            config.encoder, config.encoder_valid_num_quantizers, config.encode_downsample_rate
        )
    return decoder, encoder


def checkpoint_tensors(decoder: CodecDecoder, encoder: ReferenceEncoder) -> dict[str, torch.Tensor]:
    """Every tensor of the codec under its checkpoint name (the live tensors, not copies)."""
    tensors = {f"decoder.{name}": t for name, t in decoder.state_dict(keep_vars=True).items()}
    for name, t in encoder.state_dict(keep_vars=True).items():
        tensors[ReferenceEncoder.checkpoint_key(name)] = t
    return tensors


def load_codec(
    audio_tokenizer_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> Codec:
    """Load the codec in FP32 on `device` (`dtype` is accepted for symmetry and ignored unless float32)."""
    require_fp32(dtype)
    directory = Path(audio_tokenizer_dir)
    config = read_codec_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"codec weights not found: {weights}")
    device = torch.device(device)
    decoder, encoder = build_codec_modules(config, device)
    targets = checkpoint_tensors(decoder, encoder)
    unexpected, misshaped = [], []
    with torch.no_grad(), safe_open(str(weights), framework="pt", device=str(device)) as reader:
        for key in reader.keys():
            target = targets.pop(key, None)
            if target is None:
                unexpected.append(key)
                continue
            tensor = reader.get_tensor(key)
            if tuple(tensor.shape) != tuple(target.shape):
                misshaped.append(f"{key} {tuple(tensor.shape)} (expected {tuple(target.shape)})")
                continue
            target.copy_(tensor)
    problems = []
    if targets:
        problems.append(f"{len(targets)} missing, e.g. {sorted(targets)[:5]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected, e.g. {sorted(unexpected)[:5]}")
    if misshaped:
        problems.append(f"{len(misshaped)} mis-shaped, e.g. {misshaped[:5]}")
    if problems:
        raise CheckpointError(f"{weights} does not match its config.json: " + "; ".join(problems))
    encoder.after_load()
    log.info("codec loaded from %s on %s (float32)", directory, device)
    return Codec(config, decoder, encoder)
