"""Compile bundles: what compiling produced on one host, carried to every host of the same kind.

`breeze-worker compile --model DIR --out BUNDLE` starts the engine as `serve` would with the same settings,
builds everything before returning (every batch shape compiled and captured, every codec batch) and writes one
file; `serve --compile-bundle BUNDLE` (BREEZE_ENGINE_COMPILE_BUNDLE) installs it into this host's empty caches
before anything compiles, so its compiles are cache hits. What a bundle holds, each as one part:

- `torch-cache`: PyTorch's cache artifacts (`torch.compiler.save_cache_artifacts`): Inductor's compiled graphs
  with their Triton kernels, AOT autograd's entries and autotuning results, of everything this process compiled
  or found in its caches. Chosen because it is PyTorch's own portable form of exactly the caches a warm host
  has (measured on the CPU: a fresh process that installs it compiles the same function from the cache,
  AOT autograd and Inductor both hits); AOTInductor packages would need the step rewritten as exported
  programs, and Triton's cache alone leaves Inductor's lowering to be redone.
- `triton-cache`: Triton's cache directory (the kernels of ours that run outside a compiled region, such as
  the sampling kernel of the uncompiled starter shape), as a tar archive; Triton keys each entry itself.
- `codec-forms`: the codec's convolution forms chosen on the building host (engine/codec_graphs.py
  `FormStore`), so that the compiled codec step is the same program, hence a cache hit.

The key says what makes the compiled code valid and what it was compiled for: the GPU's compute capability,
the torch, Triton, CUDA and Python versions, a hash of the model's configuration (language model and codec),
and the settings that change shapes or kernels (streams, precision, the fast path's settings, the codec's).
A bundle is installed only when its key equals this worker's, its length is whole and every part's SHA-256
matches; otherwise one log line says why and the worker compiles as it would without it. An installed part
only adds entries that the caches look up by their own keys (a part never replaces a file already there), so
the worst a bad bundle can do is miss.

File layout: the magic line, one JSON header line (key, parts with their sizes and SHA-256, the payload's),
then the parts' bytes in order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import platform
import shutil
import tarfile
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MAGIC = b"breeze-compile-bundle\n"
FORMAT = 1
TORCH_CACHE, TRITON_CACHE, CODEC_FORMS = "torch-cache", "triton-cache", "codec-forms"
MAX_HEADER_BYTES = 1 << 20


class BundleError(ValueError):
    """A bundle that cannot be used: unreadable, incomplete, corrupt, or built for another kind of host."""


# ---- the key ----
def model_digest(model) -> str:
    """A hash of what the model's shapes come from: the language model's and the codec's configuration and the
    cache capacity (not the weights: compiled code does not depend on their values)."""
    doc = {"lm": _plain(model.config), "max_sequence": model.generation_defaults.max_sequence,
           "codec": _plain(model.codec.config) if model.codec is not None else None}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _plain(obj):
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    to_dict = getattr(obj, "to_dict", None)
    return to_dict() if callable(to_dict) else repr(obj)


def bundle_key(settings, model, device: torch.device, precision: str) -> dict:
    """The key of a bundle for a worker with engine `settings` (config.py EngineSettings) serving `model` on
    `device` in `precision` (the policy's name)."""
    fastpath = settings.fastpath
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    capability = (".".join(map(str, torch.cuda.get_device_capability(device))) if device.type == "cuda" else None)
    return {
        "format": FORMAT,
        "device": device.type, "compute_capability": capability,
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
        "python": ".".join(platform.python_version_tuple()[:2]),
        "model": model_digest(model),
        "precision": precision,
        "max_active_streams": settings.max_active_streams,
        "codec_compile_slots": settings.codec_compile_slots, "codec_tf32": settings.codec_tf32,
        "codec_precision": settings.codec_precision,
        "fastpath": {"compile": fastpath.compile, "compile_backend": fastpath.compile_backend, "form": fastpath.form,
                     "tune": fastpath.tune, "sampler": fastpath.sampler, "dynamic_shapes": fastpath.dynamic_shapes,
                     "half_kv": fastpath.half_kv,
                     "kernels": {"chained": fastpath.kernels.chained, "plans": dict(fastpath.kernels.plans)}},
    }


def key_differences(want: dict, got: dict, prefix: str = "") -> list[str]:
    """`name: bundle's value != this worker's` for every key field that differs."""
    out = []
    for name in sorted(set(want) | set(got)):
        a, b = got.get(name), want.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            out += key_differences(b, a, f"{prefix}{name}.")
        elif a != b:
            out.append(f"{prefix}{name}: bundle {a!r}, this worker {b!r}")
    return out


# ---- writing ----
def collect_parts() -> dict[str, bytes]:
    """This process's parts: its torch cache artifacts (what it compiled or hit), Triton's cache directory and
    the codec's convolution forms."""
    parts: dict[str, bytes] = {}
    saved = torch.compiler.save_cache_artifacts()
    parts[TORCH_CACHE] = saved[0] if saved is not None else b""
    triton_dir = triton_cache_dir()
    parts[TRITON_CACHE] = _tar_of(triton_dir) if triton_dir is not None else b""
    parts[CODEC_FORMS] = _tar_of(forms_dir(), pattern="codec-forms-*.json")
    return parts


def write_bundle(path: Path, key: dict, parts: dict[str, bytes], built_by: dict | None = None) -> dict:
    """Write a bundle atomically (a temporary file renamed into place); returns its header."""
    payload_hash = hashlib.sha256()
    listed = []
    for name, data in parts.items():
        listed.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        payload_hash.update(data)
    header = {"format": FORMAT, "key": key, "parts": listed, "payload_sha256": payload_hash.hexdigest(),
              "built_by": built_by or {}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
        for data in parts.values():
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return header


# ---- reading ----
def read_bundle(path: Path) -> tuple[dict, dict[str, bytes]]:
    """The header and the parts of a whole, uncorrupted bundle; BundleError saying what is wrong otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read it ({exc})") from None
    if not data.startswith(MAGIC):
        raise BundleError("not a compile bundle (its first line is not the bundle's)")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER_BYTES)
    if end < 0:
        raise BundleError("its header is incomplete (the file is truncated)")
    try:
        header = json.loads(data[len(MAGIC):end])
        listed = [(str(p["name"]), int(p["bytes"]), str(p["sha256"])) for p in header["parts"]]
        payload_sha = str(header["payload_sha256"])
        if not isinstance(header["key"], dict):
            raise TypeError("key")
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"its header is unreadable ({type(exc).__name__}: {exc})") from None
    if header.get("format") != FORMAT:
        raise BundleError(f"format {header.get('format')!r}, this worker reads format {FORMAT}")
    payload = memoryview(data)[end + 1:]
    expected = sum(size for _, size, _ in listed)
    if len(payload) != expected:
        raise BundleError(f"its payload is {len(payload)} bytes, its header lists {expected} (the file is "
                          f"{'truncated' if len(payload) < expected else 'longer than written'})")
    if hashlib.sha256(payload).hexdigest() != payload_sha:
        raise BundleError("its payload's SHA-256 does not match its header (the file is corrupt)")
    parts, offset = {}, 0
    for name, size, sha in listed:
        chunk = bytes(payload[offset:offset + size])
        offset += size
        if hashlib.sha256(chunk).hexdigest() != sha:
            raise BundleError(f"part {name}'s SHA-256 does not match its header (the file is corrupt)")
        parts[name] = chunk
    return header, parts


class Bundle:
    """A bundle read, verified and matched against this worker's key once; `install` puts parts of it into this
    host's caches (the start-up installs Triton's and the codec's at once, the torch cache before its first
    compile)."""

    def __init__(self, path: Path, header: dict, parts: dict[str, bytes]):
        self.path, self.header, self.parts = Path(path), header, parts
        self.installed: dict[str, int] = {}

    def install(self, names: tuple[str, ...] = (TRITON_CACHE, CODEC_FORMS, TORCH_CACHE)) -> dict[str, int]:
        """Install the parts `names` not installed yet ({part: entries installed}); a part that fails is logged
        and left out (those compiles run as without a bundle). Never raises."""
        t0 = time.perf_counter()
        done: dict[str, int] = {}
        for name in names:
            data = self.parts.pop(name, None)  # installed once; its bytes go
            if data is None:
                continue
            try:
                done[name] = _INSTALLERS[name](data)
            except Exception as exc:  # noqa: BLE001 - a part that cannot be installed is a miss, not a failure
                log.warning("compile bundle %s: part %s not installed (%s: %s); those compiles run as without a "
                            "bundle", self.path, name, type(exc).__name__, exc)
        self.installed.update(done)
        if done:
            log.info("compile bundle %s: installed %s in %.2f s", self.path,
                     ", ".join(f"{name} ({count} entries)" for name, count in done.items()),
                     time.perf_counter() - t0)
        return done

    @property
    def pending(self) -> tuple[str, ...]:
        return tuple(self.parts)


def open_bundle(path: Path, key: dict) -> Bundle | None:
    """The bundle at `path` when it is whole, uncorrupted and built for `key`; else None after one log line
    saying why (the worker then compiles as it would without one). Never raises."""
    try:
        header, parts = read_bundle(path)
    except BundleError as exc:
        log.warning("compile bundle %s not used: %s; compiling as without a bundle", path, exc)
        return None
    differences = key_differences(key, header["key"])
    if differences:
        log.warning("compile bundle %s not used: built for another kind of host or other settings (%s); compiling "
                    "as without a bundle", path, "; ".join(differences))
        return None
    return Bundle(path, header, parts)


def _install_torch_cache(data: bytes) -> int:
    if not data:
        return 0
    info = torch.compiler.load_cache_artifacts(data)
    return sum(len(v) for v in info.artifacts.values()) if info is not None else 0


def _install_tar(data: bytes, directory: Path | None) -> int:
    """Extract the files of a tar archive that `directory` lacks (regular files only, inside it); count."""
    if not data or directory is None:
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive.getmembers():
            target = (directory / member.name).resolve()
            if not member.isfile() or not target.is_relative_to(directory.resolve()) or target.exists():
                continue
            source = archive.extractfile(member)
            if source is None:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as out:
                shutil.copyfileobj(source, out)
            os.replace(tmp, target)
            count += 1
    return count


_INSTALLERS = {
    TORCH_CACHE: _install_torch_cache,
    TRITON_CACHE: lambda data: _install_tar(data, triton_cache_dir()),
    CODEC_FORMS: lambda data: _install_tar(data, forms_dir()),
}


def _tar_of(directory: Path, pattern: str = "**/*") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as archive:
        if directory.is_dir():
            for path in sorted(directory.glob(pattern)):
                if path.is_file() and not path.name.endswith(".tmp"):
                    archive.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buffer.getvalue()


def triton_cache_dir() -> Path | None:
    """Where Triton keeps its compiled kernels in this process (Triton's own answer: TRITON_CACHE_DIR or its
    default); None without Triton (the CPU)."""
    try:
        from triton.runtime.cache import default_cache_dir
    except Exception:  # noqa: BLE001 - no Triton here
        return None
    return Path(default_cache_dir())


def forms_dir() -> Path:
    from breeze_worker.engine.codec_graphs import forms_directory

    return forms_directory()
