#!/usr/bin/env python
"""Build the codec golden fixture: tiny random weights, decoded and encoded by the reference implementation.

One command, from the repository root, with the project's virtualenv active:

    python scripts/make_codec_golden.py

What it does:
  1. (project venv) builds our tiny codec (`tiny_codec(seed=GOLDEN_SEED, codebook_size=128)`), writes it in
     the official `audio_tokenizer/` layout with OUR writer, and draws the inputs: codes [2, 16, 10] and a
     16,000-sample synthetic waveform (not a multiple of 1920, so the frame trimming is exercised);
  2. creates the separate reference virtualenv `.codec-golden-env/` (git-ignored) if it is missing: the
     same torch as this one, transformers==4.57.3 and `qwen-tts==0.1.1 --no-deps` (never a run-time
     dependency of the worker);
  3. (reference venv) re-runs this file with `--reference`: loads the folder with the reference's
     `Qwen3TTSTokenizerV2Model.from_pretrained` (the package `__init__`, which imports gradio-era extras,
     is bypassed; no missing or unexpected tensor is tolerated), decodes the codes and encodes the
     waveform (through transformers' EncodecFeatureExtractor, as the reference tokenizer does);
     It also records the reference's configuration defaults: every decoder_config and top-level key's
     value when the key is absent, the attention head size when `head_dim` is absent, and whether a
     decoder can be built without `codebook_dim`;
  4. saves `tests/fixtures/codec_golden/{audio_tokenizer/, golden.npz, reference_defaults.json}`.
The tests (tests/codec/test_codec_golden.py) load the folder with our loader and compare.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "codec_golden"
GOLDEN_ENV = ROOT / ".codec-golden-env"
GOLDEN_SEED = 1234
CODEBOOK_SIZE = 128
REFERENCE_PACKAGES = ["transformers==4.57.3"]
REFERENCE_PACKAGE_NO_DEPS = "qwen-tts==0.1.1"


def make_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(GOLDEN_SEED)
    codes = rng.integers(0, CODEBOOK_SIZE, size=(2, 16, 10), dtype=np.int64)
    t = np.arange(16000) / 24000.0
    pitch = 140.0 + 60.0 * t  # a gliding harmonic tone with a little noise, speech-like level
    phase = 2 * np.pi * np.cumsum(pitch) / 24000.0
    audio = sum(0.2 / k * np.sin(k * phase) for k in range(1, 6)) + 0.01 * rng.standard_normal(t.shape)
    audio = (audio * np.hanning(len(t)) ** 0.25).astype(np.float32)
    return {"codes": codes, "audio": audio}


def ensure_reference_env() -> Path:
    python = GOLDEN_ENV / "bin" / "python"
    if python.exists():
        return python
    import torch

    torch_spec = os.environ.get("GOLDEN_TORCH_SPEC", f"torch=={torch.__version__.split('+')[0]}")
    subprocess.run([sys.executable, "-m", "venv", str(GOLDEN_ENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, torch_spec, *REFERENCE_PACKAGES], check=True)
    subprocess.run([*pip, "--no-deps", REFERENCE_PACKAGE_NO_DEPS], check=True)
    return python


def build_fixture() -> None:
    sys.path.insert(0, str(ROOT / "worker"))
    from breeze_worker.model.codec.tiny import tiny_codec, write_codec_checkpoint

    checkpoint = FIXTURE / "audio_tokenizer"
    write_codec_checkpoint(tiny_codec(seed=GOLDEN_SEED, codebook_size=CODEBOOK_SIZE), checkpoint)
    inputs = make_inputs()
    python = ensure_reference_env()
    with tempfile.TemporaryDirectory() as tmp:
        inputs_path, expected_path = Path(tmp) / "inputs.npz", Path(tmp) / "expected.npz"
        np.savez(inputs_path, **inputs)
        subprocess.run(
            [str(python), __file__, "--reference", str(checkpoint), str(inputs_path), str(expected_path)],
            check=True,
        )
        expected = dict(np.load(expected_path))
        subprocess.run([str(python), __file__, "--reference-defaults", str(FIXTURE / "reference_defaults.json")],
                       check=True)
    np.savez_compressed(FIXTURE / "golden.npz", **inputs, **expected)
    total = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    print(f"wrote {FIXTURE} ({total / 1024:.0f} KiB); expected codes {expected['expected_codes'].shape}")


# ---- everything below runs inside the reference virtualenv (no breeze_worker there) ----


def _import_reference_tokenizer():
    """Load qwen_tts/core/tokenizer_12hz/* without running qwen_tts/__init__.py."""
    spec = importlib.util.find_spec("qwen_tts")
    base = Path(next(iter(spec.submodule_search_locations))) / "core" / "tokenizer_12hz"
    package = types.ModuleType("reference_tokenizer_12hz")
    package.__path__ = [str(base)]
    sys.modules[package.__name__] = package
    modules = {}
    for name in ("configuration_qwen3_tts_tokenizer_v2", "modeling_qwen3_tts_tokenizer_v2"):
        full = f"{package.__name__}.{name}"
        module_spec = importlib.util.spec_from_file_location(full, base / f"{name}.py")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[full] = module
        module_spec.loader.exec_module(module)
        modules[name] = module
    return modules["modeling_qwen3_tts_tokenizer_v2"].Qwen3TTSTokenizerV2Model


def reference_defaults(out_path: str) -> None:
    """The reference's value for every configuration key that a config.json may leave out."""
    _import_reference_tokenizer()
    config_module = sys.modules["reference_tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2"]
    modeling = sys.modules["reference_tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2"]
    decoder = config_module.Qwen3TTSTokenizerV2DecoderConfig()
    top = config_module.Qwen3TTSTokenizerV2Config()
    generic = set(config_module.PretrainedConfig().to_dict())  # keys every transformers config carries
    decoder_defaults = {k: v for k, v in decoder.to_dict().items() if k not in generic or k == "num_hidden_layers"}
    top_keys = ("encoder_valid_num_quantizers", "input_sample_rate", "output_sample_rate", "decode_upsample_rate",
                "encode_downsample_rate")
    small = config_module.Qwen3TTSTokenizerV2DecoderConfig(hidden_size=96, num_attention_heads=4)
    head_dim = modeling.Qwen3TTSTokenizerV2DecoderAttention(small, 0).head_dim
    try:
        modeling.Qwen3TTSTokenizerV2Decoder(small)
        without_codebook_dim = "built"
    except AttributeError as exc:
        without_codebook_dim = f"AttributeError: {exc}"
    result = {
        "decoder_config": {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(decoder_defaults.items())},
        "top_level": {k: getattr(top, k) for k in top_keys},
        "head_dim_when_absent": {"hidden_size": 96, "num_attention_heads": 4, "head_dim": head_dim},
        "decoder_without_codebook_dim": without_codebook_dim,
    }
    Path(out_path).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def run_reference(checkpoint: str, inputs_path: str, expected_path: str) -> None:
    import torch
    from transformers import EncodecFeatureExtractor

    torch.set_num_threads(1)
    model_class = _import_reference_tokenizer()
    model, info = model_class.from_pretrained(checkpoint, output_loading_info=True, dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"the reference did not load our checkpoint cleanly: {problems}")
    model.eval()
    inputs = np.load(inputs_path)
    with torch.inference_mode():
        codes = torch.from_numpy(inputs["codes"]).transpose(1, 2)  # reference takes [B, T, 16]
        audio_values = model.decode(codes, return_dict=True).audio_values
        expected_audio = torch.stack(list(audio_values)).float().numpy()
        extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0)
        features = extractor(raw_audio=[inputs["audio"]], sampling_rate=24000, return_tensors="pt")
        encoded = model.encode(
            features["input_values"].squeeze(1).float(), features["padding_mask"].squeeze(1), return_dict=True
        )
        expected_codes = encoded.audio_codes[0].numpy().astype(np.int64)
    np.savez(expected_path, expected_audio=expected_audio, expected_codes=expected_codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", nargs=3, metavar=("CHECKPOINT", "INPUTS", "EXPECTED"), help=argparse.SUPPRESS)
    parser.add_argument("--reference-defaults", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference:
        run_reference(*args.reference)
    elif args.reference_defaults:
        reference_defaults(args.reference_defaults)
    else:
        build_fixture()


if __name__ == "__main__":
    main()
