"""Synthetic checkpoints: the official directory layout at full, mid or tiny size, with seeded random weights.

`write_synthetic_checkpoint(out, size, seed)` writes what `load_checkpoint` reads from a real Breeze TTS 2
download (config.json with its decoy keys, generation_config.json, tokenizer.json, an index and two shards with
the dead tensors present, `audio_tokenizer/` with the codec's encoder and decoder), so the loader, the
reference path and the whole worker run at the released sizes without downloading anything.

Its audio is NOT speech: the weights are random (normal(0, 0.02) matrices, norm gains near their identity),
and so is what the model generates. It is for measuring speed, memory and start-up, and for exercising every
code path at the real shapes; never for listening tests or quality claims.

Its tokenizer spells text letter by letter, except `WORDS` (common English words and the benchmarks'),
which are one token each at full and mid size, about as a real vocabulary has them: the prompts' token counts,
and with them the text encoder's cost at a join, stay near a real checkpoint's.

Weights are drawn on the CPU, one tensor at a time in sorted-name order from one seeded generator, and stored
in the target dtype (bf16 by default, as the release ships): the same seed gives the same files on any machine.
Peak host memory is about the weights in the target dtype (~7 GB for full size in bf16).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from breeze_worker.model.codec.config import CodecConfig, released_decoder_config
from breeze_worker.model.codec.tiny import codec_from_config, tiny_codec
from breeze_worker.model.lm.breeze import BreezeLM
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.loaded import SYNTHETIC_NOTICE, GenerationDefaults, LoadedModel
from breeze_worker.model.loader import write_checkpoint
from breeze_worker.model.tokenizer import BreezeTokenizer

SIZES = ("full", "mid", "tiny")
# The full and mid tokenizers' whole-word tokens (model/tokenizer.py `build_tiny_tokenizer`): common English
# words and those of the benchmarks' texts (breeze-client bench's labels, the serve bench's reference line,
# the warm-up prompt), so their prompts come to about the 1-1.5 tokens a word of the real 262k vocabulary,
# not one token a letter. tests/model/test_synthetic_checkpoint.py checks the labels' rate.
WORDS = """
a about after again all also an and any are as at back be because been before being both but by call can
come could day did do does down each even every first for from get give go good had has have he her here him
his how i if in into is it its just know like little long look made make many may me more most much must my
new no not now of off on one only or other our out over own people right said same see she should so some
still such take than that the their them then there these they thing think this those through time to too
two under up us use very want was way we well were what when where which while who will with work would year
you your
The library opens nine tomorrow morning please bring card Our team spent afternoon testing speech system
laptop corner office It read weather report recipe lentil soup pages travel guide northern coast Everyone
agreed voice sounded calm pauses felt natural nobody noticed delay When ferry finally left harbour
passengers crowded along railings watch town grow small behind A child pointed lighthouse asked lamp seen
far sea Her grandfather explained glass around flame bent light narrow beam sailors once counted flashes
which passing Later wind picked sky turned pale shade grey people went inside drink tea play cards By
evening islands appeared horizon dark quiet few windows already glowing warmly dusk Thank calling service
desk Your request received technician contact within full working days Please keep reference number ready
call Turn next junction continue straight ahead three hundred metres until bridge package delivered front
door Stella Ask things store Speak clearly naturally short sentence warm model Hello serve benchmark
""".split()
NOTICE = SYNTHETIC_NOTICE  # the loader reads it: the worker then says its audio is not speech
_CHUNK = 1 << 24  # elements drawn at a time in float32 before the cast (64 MB)


def config_for(size: str) -> BreezeConfig:
    """full: the released sizes; mid: full widths with few layers (a fast check at real shapes); tiny."""
    if size == "full":
        return BreezeConfig.full_size()
    if size == "tiny":
        return BreezeConfig.tiny()
    if size == "mid":
        full = BreezeConfig.full_size()
        te = replace(full.text_encoder, num_hidden_layers=2, layer_types=("sliding_attention", "full_attention"))
        return replace(full, text_encoder=te, backbone=replace(full.backbone, num_hidden_layers=4),
                       depth=replace(full.depth, num_hidden_layers=3))
    raise ValueError(f"model size must be one of {SIZES}, not {size!r}")


def released_encoder_config() -> dict:
    """The Mimi encoder block of the released codec's config.json (transformers' MimiConfig defaults)."""
    return {
        "model_type": "mimi", "_frame_rate": 12.5, "audio_channels": 1, "sampling_rate": 24000,
        "hidden_size": 512, "num_filters": 64, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2,
        "use_causal_conv": True, "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0,
        "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32, "num_semantic_quantizers": 1,
        "vector_quantization_hidden_dimension": 256, "upsample_groups": 512, "use_conv_shortcut": False,
        "num_hidden_layers": 8, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8,
        "head_dim": 64, "hidden_act": "gelu", "max_position_embeddings": 8000, "norm_eps": 1e-5,
        "rope_theta": 10000.0, "sliding_window": 250, "layer_scale_initial_scale": 0.01, "attention_bias": False,
    }


@torch.no_grad()
def random_lm(config: BreezeConfig, seed: int, dtype: torch.dtype) -> BreezeLM:
    """The language model in `dtype` on the CPU, every parameter drawn as the tiny default draws them:
    normal(0, 0.02), norm gains 1 + 0.1 noise (0.1 noise for the text encoder's Gemma norms, which scale by
    1 + w)."""
    with torch.device("meta"):
        lm = BreezeLM(config)
    lm = lm.to(dtype=dtype).to_empty(device="cpu")
    lm.reset_buffers()
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(lm.named_parameters()):
        flat = param.view(-1)
        gemma = name.startswith("text_encoder.")
        for start in range(0, flat.numel(), _CHUNK):
            piece = torch.randn(min(_CHUNK, flat.numel() - start), generator=generator)
            if name.endswith("norm.weight"):
                piece.mul_(0.1).add_(0.0 if gemma else 1.0)
            else:
                piece.mul_(0.02)
            flat[start:start + piece.numel()].copy_(piece)
    return lm.eval().requires_grad_(False)


def _codec(size: str, seed: int):
    if size == "tiny":
        return tiny_codec(seed)
    return codec_from_config(CodecConfig(decoder=released_decoder_config(), encoder=released_encoder_config()), seed)


def _notice_head(size: str, seed: int) -> str:
    return f"Synthetic Breeze TTS 2 checkpoint ({size} size, seed {seed}, "


def written_whole(out: str | Path, size: str, seed: int = 0) -> bool:
    """Whether `out` holds a synthetic checkpoint of `size` and `seed` that `write_synthetic_checkpoint` finished
    writing (its notice, the last file written, names both)."""
    notice = Path(out) / NOTICE
    return notice.is_file() and notice.read_text(encoding="utf-8").startswith(_notice_head(size, seed))


def write_synthetic_checkpoint(out: str | Path, size: str, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write a synthetic checkpoint directory (see the module doc); `out` must not hold files yet."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: choose a new directory")
    config = config_for(size)
    tokenizer = BreezeTokenizer.tiny(config, WORDS if size != "tiny" else ())
    model = LoadedModel(config=config, lm=random_lm(config, seed, dtype), tokenizer=tokenizer,
                        generation_defaults=GenerationDefaults(), codec=_codec(size, seed),
                        is_tiny_default=False)
    write_checkpoint(model, out, dead_tensor_dtype=dtype)
    (out / NOTICE).write_text(
        f"{_notice_head(size, seed)}{str(dtype).removeprefix('torch.')}), "
        "written by `breeze-worker make-checkpoint`.\n"
        "The weights are RANDOM: what it generates is NOT speech. Use it to measure speed, memory and start-up "
        "and to run every code path at real shapes; never for listening tests or quality claims.\n",
        encoding="utf-8")
    return out
