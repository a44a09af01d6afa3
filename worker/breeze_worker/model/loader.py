"""Official checkpoint directory <-> `LoadedModel`.

`load_checkpoint` reads config.json (decoy top-level keys ignored), generation_config.json, tokenizer.json
(with tokenizer_config.json where present, as transformers reads them)
and the safetensors shards named by model.safetensors.index.json. The model is built on the meta device,
materialized uninitialized on the target device, and filled one tensor at a time. `safe_open` validates
the shard headers (names, shapes); the data is read by offset straight into each parameter (through a 16 MB
staging buffer when the dtype or device differs), never memory-mapped, so peak host memory stays at the
live weights plus a few MB. Dead tensors (`embed_text_tokens.*`, `codec_model.*`) are never read. The
backbone's audio embedding is the depth decoder's `embed_tokens` (one module), so the tie holds by
construction. Any missing, unexpected or mis-shaped tensor is a `CheckpointError` naming it and both shapes;
so is a weight stored in a non-floating dtype, a tensor a shard holds but the index does not list (dead
tensors excepted), an index without a `weight_map`, and a shard safetensors cannot read (named).

`write_checkpoint` writes the same official layout (used by tests and to export the tiny default).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from breeze_worker.errors import CheckpointError
from breeze_worker.model.codec import load_codec, write_codec_checkpoint
from breeze_worker.model.lm.breeze import BreezeLM
from breeze_worker.model.lm.config import BreezeConfig
from breeze_worker.model.loaded import SYNTHETIC_NOTICE, GenerationDefaults, LoadedModel
from breeze_worker.model.meta import materialize, no_init
from breeze_worker.model.tokenizer import BreezeTokenizer
from breeze_worker.model.weights_file import save_weights

log = logging.getLogger(__name__)

DEAD_PREFIXES = ("embed_text_tokens.", "codec_model.")
TIED_ALIAS = "backbone_model.embed_tokens.embed_audio_tokens.weight"  # = depth_decoder.model.embed_tokens.weight
TIED_NAME = "depth_decoder.model.embed_tokens.weight"
INDEX_FILE = "model.safetensors.index.json"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path.name} is missing from {path.parent}: not a Breeze TTS 2 checkpoint") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc


def _weight_map(directory: Path) -> dict[str, str]:
    """tensor name -> shard file name."""
    index = directory / INDEX_FILE
    if index.exists():
        raw = _read_json(index)
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no \"weight_map\" object (tensor name -> shard file): "
                                  "the index is broken; re-download it")
        bad = next((k for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
        if bad is not None:
            raise CheckpointError(f"{index}: weight_map[{bad!r}] is {weight_map[bad]!r}, not a shard file name")
        return dict(weight_map)
    single = directory / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"{directory} has neither {INDEX_FILE} nor model.safetensors")
    with _open_shard(single) as f:
        return {name: single.name for name in f.keys()}


def _open_shard(path: Path):
    """`safe_open` whose failures (bad header, truncated file) are a `CheckpointError` naming the shard."""
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # SafetensorError, OSError: a corrupt or truncated shard
        raise CheckpointError(f"shard {path.name} in {path.parent} cannot be read ({exc}): the file is corrupt "
                              "or truncated; re-download it") from exc


FLOATING = ("F64", "F32", "F16", "BF16")  # safetensors dtypes a weight may be stored in



@dataclass
class ShardInventory:
    """What the shard headers hold (no tensor data is read)."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # live tensors the index places here
    dtypes: dict[str, str] = field(default_factory=dict)  # their safetensors dtypes
    unlisted: list[str] = field(default_factory=list)  # problems: tensors a shard holds against the index


def _shard_shapes(directory: Path, weight_map: dict[str, str]) -> ShardInventory:
    inventory = ShardInventory()
    for shard in sorted(set(weight_map.values())):
        path = directory / shard
        if not path.exists():
            raise CheckpointError(f"shard {shard} named by {INDEX_FILE} is missing from {directory}")
        with _open_shard(path) as f:
            for name in f.keys():
                if name.startswith(DEAD_PREFIXES):
                    continue
                info = f.get_slice(name)
                shape = tuple(info.get_shape())
                listed = weight_map.get(name)
                if listed == shard:
                    inventory.shapes[name] = shape
                    inventory.dtypes[name] = info.get_dtype()
                elif listed is None:
                    inventory.unlisted.append(f"unexpected tensor {name} with shape {list(shape)} in shard {shard}: "
                                              f"{INDEX_FILE} does not list it")
                else:
                    inventory.unlisted.append(f"unexpected tensor {name} in shard {shard}: {INDEX_FILE} places it "
                                              f"in {listed}")
    return inventory


def _check_tensors(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]],
                   weight_map: dict[str, str], dtypes: dict[str, str] | None = None,
                   unlisted: list[str] | None = None) -> None:
    problems: list[str] = list(unlisted or [])
    for name, dtype in (dtypes or {}).items():
        if dtype not in FLOATING:
            problems.append(f"tensor {name} is stored as {dtype}, not a floating-point type "
                            f"({', '.join(FLOATING)}): the checkpoint is not a Breeze TTS 2 weight file")
    for name, shape in expected.items():
        if name not in found:
            where = "its shard lacks it" if name in weight_map else "no shard holds it"
            problems.append(f"missing tensor {name}: expected shape {list(shape)}, checkpoint has none ({where})")
        elif found[name] != shape:
            problems.append(f"tensor {name} has shape {list(found[name])} in the checkpoint, "
                            f"the architecture in config.json expects {list(shape)}")
    for name, shape in found.items():
        if name == TIED_ALIAS:
            if shape != expected[TIED_NAME]:
                problems.append(f"tensor {name} has shape {list(shape)} in the checkpoint, the architecture "
                                f"expects {list(expected[TIED_NAME])} (tied to {TIED_NAME})")
        elif name not in expected:
            problems.append(f"unexpected tensor {name} with shape {list(shape)}: the architecture in config.json "
                            "has no such tensor (expected shape: none)")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckpointError("checkpoint does not match its config: " + "; ".join(problems[:5]) + more)


_CHUNK_BYTES = 16 * 1024 * 1024
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def _read_header(file) -> tuple[int, dict]:
    """A safetensors header: (offset of the data section, {name: {dtype, shape, data_offsets}})."""
    size = int.from_bytes(file.read(8), "little")
    return 8 + size, json.loads(file.read(size))


def _read_shard_tensors(path: Path, names: list[str], params: dict[str, torch.Tensor], staging: torch.Tensor) -> None:
    """Read `names` from one shard straight into their parameters, one tensor at a time.

    Plain reads by offset rather than a memory map: a mapped shard's touched pages count as the process's
    resident memory until it is unmapped, which would add a shard (or at least a tensor) to the peak. A
    tensor whose dtype and device match is read in place; otherwise it goes through a 16 MB staging buffer."""
    with open(path, "rb", buffering=0) as file:
        data_start, header = _read_header(file)
        for name in names:
            entry, dest = header[name], params[name]
            begin, end = entry["data_offsets"]
            src_dtype = _DTYPES[entry["dtype"]]
            file.seek(data_start + begin)
            if dest.device.type == "cpu" and dest.dtype == src_dtype and dest.is_contiguous():
                # flat bytes: `_read_exact` counts what it has read in bytes (a [rows, bytes] view has `rows` items)
                view = dest.view(torch.uint8).numpy().data.cast("B") if dest.numel() else memoryview(b"")
                _read_exact(file, view, name)
                continue
            shape = list(entry["shape"])
            flat = dest.view(-1) if not shape else dest.reshape(shape[0], -1)
            row_bytes = (end - begin) // max(1, flat.shape[0]) if shape else end - begin
            rows_per_chunk = max(1, _CHUNK_BYTES // max(1, row_bytes))
            rows = flat.shape[0] if shape else 1
            for r0 in range(0, rows, rows_per_chunk):
                r1 = min(rows, r0 + rows_per_chunk)
                nbytes = (r1 - r0) * row_bytes
                buf = staging if nbytes <= staging.numel() else torch.empty(nbytes, dtype=torch.uint8)
                _read_exact(file, buf.numpy().data[:nbytes], name)
                chunk = buf[:nbytes].view(src_dtype)
                if shape:
                    flat[r0:r1].copy_(chunk.view(r1 - r0, -1))
                else:
                    dest.copy_(chunk.view(dest.shape))


def _read_exact(file, view: memoryview, name: str) -> None:
    done = 0
    while done < len(view):
        got = file.readinto(view[done:])
        if not got:
            raise CheckpointError(f"tensor {name} is truncated in shard {Path(file.name).name} (file shorter than "
                                  "its header says): re-download the shard")
        done += got


def load_checkpoint(directory: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32, *, require_codec: bool = True) -> LoadedModel:
    """Load a checkpoint directory. Its `audio_tokenizer/` (the codec) is required unless `require_codec`
    is False (a language-model-only load, e.g. in tests), which gives `codec=None`."""
    directory = Path(directory)
    config = BreezeConfig.from_dict(_read_json(directory / "config.json"))
    if not config.tie_codebooks_embeddings:
        raise CheckpointError("config.json sets tie_codebooks_embeddings false; only tied embeddings are supported")
    gen_path = directory / "generation_config.json"
    defaults = GenerationDefaults.from_generation_config(_read_json(gen_path) if gen_path.exists() else {})
    tokenizer = BreezeTokenizer.from_checkpoint(directory, config)
    codec_dir = directory / "audio_tokenizer"
    if require_codec and not codec_dir.is_dir():
        raise CheckpointError(f"{codec_dir} is missing: a Breeze TTS 2 checkpoint needs its audio_tokenizer/ "
                              "folder (the 12 Hz codec) next to config.json; copy it from the full checkpoint")

    with torch.device("meta"), no_init():
        lm = BreezeLM(config).to(dtype)
    expected = {name: tuple(p.shape) for name, p in lm.state_dict().items()}
    weight_map = _weight_map(directory)
    inventory = _shard_shapes(directory, weight_map)
    found = inventory.shapes
    _check_tensors(expected, found, weight_map, inventory.dtypes, inventory.unlisted)

    materialize(lm, device)
    lm.reset_buffers()
    params = lm.state_dict()
    by_shard: dict[str, list[str]] = {}
    for name in expected:
        by_shard.setdefault(weight_map[name], []).append(name)
    staging = torch.empty(_CHUNK_BYTES, dtype=torch.uint8)
    with torch.no_grad():
        for shard, names in sorted(by_shard.items()):
            _read_shard_tensors(directory / shard, sorted(names), params, staging)
    lm.eval().requires_grad_(False)
    skipped = sum(1 for n in weight_map if n.startswith(DEAD_PREFIXES))
    log.info("loaded %d tensors from %s (%d dead tensors skipped unread)", len(expected), directory, skipped)
    return LoadedModel(config=config, lm=lm, tokenizer=tokenizer, generation_defaults=defaults,
                       codec=_load_codec(codec_dir, device), is_tiny_default=False,
                       synthetic=(directory / SYNTHETIC_NOTICE).is_file())


def _load_codec(audio_tokenizer_dir: Path, device):
    if not audio_tokenizer_dir.is_dir():
        log.warning("%s is missing: the language model loads without a codec (require_codec=False)",
                    audio_tokenizer_dir)
        return None
    return load_codec(audio_tokenizer_dir, device)


def write_checkpoint(model: LoadedModel, directory: str | Path, *, dtype: torch.dtype | None = None,
                     config_overrides: dict | None = None, dead_tensors: bool = True,
                     dead_tensor_dtype: torch.dtype = torch.float32) -> Path:
    """Write `model` in the official layout: config.json (decoys included; `config_overrides` are merged
    into its top level), generation_config.json, tokenizer.json, an index and two shards, the dead tensors
    present, the tied audio embedding stored once as depth_decoder.model.embed_tokens.weight, and the
    codec as audio_tokenizer/ when the model has one."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if model.codec is not None:
        write_codec_checkpoint(model.codec, directory / "audio_tokenizer")
    raw = model.config.to_dict()
    raw.update(config_overrides or {})
    (directory / "config.json").write_text(json.dumps(raw, indent=2), encoding="utf-8")
    gen = model.generation_defaults.to_generation_config()
    (directory / "generation_config.json").write_text(json.dumps(gen, indent=2), encoding="utf-8")
    (directory / "tokenizer.json").write_text(model.tokenizer.to_str(), encoding="utf-8")

    tensors = {name: t.detach().to("cpu", dtype or t.dtype).contiguous() for name, t in model.lm.state_dict().items()}
    if dead_tensors:
        cfg = model.config
        gen_cpu = torch.Generator().manual_seed(0)
        tensors["embed_text_tokens.weight"] = torch.randn(cfg.text_vocab_size, cfg.hidden_size, generator=gen_cpu,
                                                          dtype=dead_tensor_dtype)
        tensors["codec_model.encoder.layers.0.conv.weight"] = torch.randn(8, 1, 7, generator=gen_cpu)
        tensors["codec_model.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum"] = (
            torch.randn(16, 8, generator=gen_cpu))
    names = sorted(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    running = 0
    for name in names:  # first half of the bytes in shard 1, the rest in shard 2
        t = tensors[name]
        shards[0 if running < total / 2 else 1][name] = t
        running += t.numel() * t.element_size()
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-00002.safetensors"
        save_weights(shard, directory / file, like=directory / "config.json")
        weight_map.update({name: file for name in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2), encoding="utf-8")
    return directory
