"""A tiny codec with seeded random weights (the embedded default), and a writer of the official layout.

The weights are drawn so that every path matters (layer scales, ConvNeXt gains and SnakeBeta parameters
are far from their near-zero initial values), which keeps parity tests meaningful. The same seed gives
the same weights on every machine: they come from a CPU generator, whatever the target device.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from breeze_worker.model.codec.codec import Codec, require_fp32
from breeze_worker.model.codec.config import CodecConfig, tiny_codec_config
from breeze_worker.model.codec.loader import CONFIG_FILE, WEIGHTS_FILE, build_codec_modules, checkpoint_tensors
from breeze_worker.model.weights_file import save_weights

_TRANSPOSED = re.compile(r"^decoder\.(upsample\.\d+\.0|decoder\.\d+\.block\.1)\.conv\.weight$")


def _draw(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """A value for the checkpoint tensor `name` of `shape`, by what the tensor is."""

    def normal(std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=generator) * std + mean

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.rand(shape, generator=generator) * (high - low) + low

    leaf = name.rsplit(".", 1)[-1]
    if leaf == "initialized":
        return torch.ones(shape)
    if leaf == "cluster_usage":
        return uniform(0.5, 2.0)
    if leaf in ("embedding_sum", "embed_sum"):
        return normal(1.0)
    if leaf in ("alpha", "beta"):  # SnakeBeta, log scale
        return normal(0.3)
    if leaf in ("scale", "gamma"):  # layer scale, ConvNeXt gain
        return uniform(0.1, 0.4)
    if leaf == "bias":
        return normal(0.05) if "norm" in name else normal(0.1)
    if len(shape) == 1:  # RMSNorm / LayerNorm weights
        return normal(0.1, mean=1.0)
    if _TRANSPOSED.search(name):  # [in, out, kernel]: each output sample sees 1-2 input steps
        fan_in = 2 * shape[0]
    else:  # linear [out, in] or conv [out, in / groups, kernel]
        fan_in = math.prod(shape[1:])
    gain = 1.0
    if ".conv2." in name:  # residual branches of the upsampling blocks: keep the signal from growing
        gain = 0.3
    elif name.startswith("decoder.decoder.") and shape[0] == 1:  # the output conv: speech-like level
        gain = 0.2
    return normal(gain / math.sqrt(max(fan_in, 1)))


def randomize_codec(codec: Codec, seed: int) -> None:
    """Overwrite every codec tensor with seeded draws (in checkpoint-name order)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = checkpoint_tensors(codec.decoder, codec.encoder)
    with torch.no_grad():
        for name in sorted(tensors):
            target = tensors[name]
            target.copy_(_draw(name, target.shape, generator))
    codec.encoder.after_load()


def tiny_codec(
    seed: int = 0, device: torch.device | str = "cpu", codebook_size: int = 2048, dtype: torch.dtype | None = None
) -> Codec:
    """The tiny codec (see `tiny_codec_config`) with seeded random weights, in FP32 on `device`."""
    require_fp32(dtype)
    return codec_from_config(tiny_codec_config(codebook_size), seed, device)


def codec_from_config(config: CodecConfig, seed: int, device: torch.device | str = "cpu") -> Codec:
    with torch.random.fork_rng(devices=[]):  # module construction must not disturb the caller's RNG
        decoder, encoder = build_codec_modules(config, "cpu")
    codec = Codec(config, decoder, encoder)
    randomize_codec(codec, seed)
    return codec.to(device)


def write_codec_checkpoint(codec: Codec, directory: str | Path) -> Path:
    """Write `codec` as an official `audio_tokenizer/` folder (config.json + model.safetensors)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(codec.config.to_dict(), indent=2, sort_keys=True) + "\n")
    tensors = {
        name: t.detach().to("cpu", torch.float32).contiguous()
        for name, t in checkpoint_tensors(codec.decoder, codec.encoder).items()
    }
    save_weights(tensors, directory / WEIGHTS_FILE, like=directory / CONFIG_FILE)
    return directory
