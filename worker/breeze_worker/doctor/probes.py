"""The doctor's measurements. Each probe returns a JSON-able dict or raises `NotMeasured` with the reason,
which reaches the report verbatim; `measure` runs them in order on one device within a time budget.

Order and why: copy bandwidth; the precision check, first because its FP32 reference is the largest thing
the doctor puts on the device (it runs measure/agreement.py's teacher-forced comparison on a few frames,
eager code that caches nothing); then the serving model is loaded as the worker loads it (for fp16-mixed:
FP32 first, the overflow probe, then the conversion) and its byte floor computed; start-up builds the worker's
own engine for one stream (`Runtime.stepper_for` + `warm_up`: compile, graph capture, codec graphs) while the
compilers' caches are still cold; memory measures one stream slot's caches against that engine; last, the
fast-path probe times batch-1 requests with CFG on and off through the bench's runner (the figures the
recorded runs are comparable with). The device never holds two models.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from breeze_worker.doctor import footprint
from breeze_worker.errors import CheckpointError
from breeze_worker.model.lm.config import BreezeConfig

log = logging.getLogger(__name__)

PROBES = ("copy_bandwidth", "floor", "startup", "memory", "fast_path", "precision")
# the least time (s) a probe is started with; a probe with less left is reported as not measured
MIN_SECONDS = {"startup": 20.0, "memory": 5.0, "fast_path": 20.0, "precision": 30.0}
BANDWIDTH_MB = 1024  # copied to measure bandwidth (2 GiB on the device while it runs)
MEMORY_SLOTS = 4  # stream slots of the cache-only stepper compared with two (a 1-slot stepper holds 3 rows)
LOAD_MARGIN_BYTES = 1 << 30  # activations, workspaces and the codec's buffers beyond the weights
FAST_KEYS = ("ms_per_frame", "generate_ms_per_frame", "codec_ms_per_frame", "ttfa_ms", "ttfa_lm_ms",
             "ttfa_codec_ms", "rtf", "frames", "repeats", "first_use_s", "compiled", "fallback_reason",
             "compile_fallback_reason", "gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "stages_s")


class NotMeasured(Exception):
    """A probe could not run here; the message says why."""


@dataclass
class ModelSpec:
    """The model the doctor measures: a checkpoint directory, or the architecture at `size` with seeded random
    weights (the full size by default: the released shapes, no download)."""

    model_dir: str | None = None
    size: str = "full"
    seed: int = 1234

    @property
    def label(self) -> str:
        return self.model_dir or f"random-{self.size}"

    def config(self) -> BreezeConfig:
        """The configuration alone (config.json of a checkpoint), read without loading any weight."""
        if self.model_dir is None:
            from breeze_worker.model.synthetic import config_for

            return config_for(self.size)
        path = Path(self.model_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"--model {self.model_dir}: no config.json there (expected a Breeze TTS 2 checkpoint "
                             "directory)")
        try:
            return BreezeConfig.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError, CheckpointError) as exc:
            raise ValueError(f"--model {self.model_dir}: config.json is not a Breeze TTS 2 config ({exc})") from exc


@dataclass
class Budget:
    """Seconds left of the doctor's time budget."""

    seconds: float
    started: float = field(default_factory=time.perf_counter)

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.started)

    def require(self, probe: str) -> None:
        need, left = MIN_SECONDS.get(probe), self.left()
        if need is not None and left < need:
            raise NotMeasured(f"time budget spent: {max(left, 0.0):.0f} s of --budget-s {self.seconds:.0f} left, "
                              f"{probe} needs about {need:.0f} s or more")


def release(device: torch.device) -> None:
    """Drop pooled fast-path runners and return freed memory to the device."""
    from breeze_worker.engine.fastpath.graph import clear_runners

    clear_runners()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _allocated(device: torch.device) -> int:
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0


def _reserved(device: torch.device) -> int:
    return int(torch.cuda.memory_reserved(device)) if device.type == "cuda" else 0


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _free(device: torch.device) -> int | None:
    return int(torch.cuda.mem_get_info(device)[0]) if device.type == "cuda" else None


# ---------------------------------------------------------------- bandwidth and the floor


def probe_bandwidth(device: torch.device) -> dict:
    from breeze_worker.measure.instruments import copy_bandwidth

    if device.type != "cuda":
        raise NotMeasured("no CUDA device: copy bandwidth is a GPU figure")
    free = _free(device)
    if free is not None and free < 3 * BANDWIDTH_MB * 2**20:
        raise NotMeasured(f"too little free GPU memory for the copy ({free / 2**30:.1f} GiB free, needs "
                          f"{2 * BANDWIDTH_MB / 1024:.0f} GiB)")
    rate = copy_bandwidth(device, megabytes=BANDWIDTH_MB)
    return {"bytes_per_s": rate, "megabytes": BANDWIDTH_MB,
            "method": "device-to-device copy, bytes read + written per second (measure/instruments.py)"}


def probe_floor(lm, bandwidth: float | None, source: str) -> dict:
    """The loaded model's bytes per frame (measure/report.py) and the floor at the measured bandwidth."""
    from breeze_worker.measure.report import bytes_per_frame

    weights = bytes_per_frame(lm)
    return {"bytes_per_frame": weights, "floor_ms": None if not bandwidth else 1000.0 * weights["total"] / bandwidth,
            "source": source}


# ---------------------------------------------------------------- loading


def load_model(spec: ModelSpec, device: torch.device, policy_name: str, with_codec: bool = True):
    """The model in `policy_name`, as the worker would serve it: for fp16-mixed, loaded in FP32, probed for
    layers whose activations approach the FP16 limit (kept FP32), then converted. Returns (model, info)."""
    from breeze_worker.engine.precision import apply_policy, find_overflowing_layers, make_policy

    policy = make_policy(policy_name, "doctor")
    load_as = make_policy("fp32", "doctor") if policy.mixed else policy
    t0 = time.perf_counter()
    if spec.model_dir is not None:
        from breeze_worker.measure.models import checkpoint_model

        model = checkpoint_model(spec.model_dir, device, load_as)
    else:
        from breeze_worker.measure.models import random_model

        model = random_model(spec.size, spec.seed, device, load_as, with_codec=with_codec)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    info: dict[str, object] = {"load_s": time.perf_counter() - t0, "overflow_probe_s": None, "kept_fp32": []}
    if policy.mixed:
        from breeze_worker.engine.eager import EagerFrameGenerator
        from breeze_worker.measure.setup import DEFAULT_TEXT, make_request

        t1 = time.perf_counter()
        probe = make_request(model, DEFAULT_TEXT, False, 4, spec.seed)
        keep = find_overflowing_layers(model.lm, lambda: list(EagerFrameGenerator(model, probe, device)))
        apply_policy(model.lm, policy, keep_fp32=keep)
        info.update(overflow_probe_s=time.perf_counter() - t1, kept_fp32=sorted(keep))
    return model, info


def refuse_small(config: BreezeConfig, policy: str, free_bytes: int | None, capacity: int = 2048) -> str | None:
    """Why the device is too small for the serving model and one stream (None: it fits, or unknown)."""
    need = required_bytes(config, policy, capacity)
    if free_bytes is None or free_bytes >= need:
        return None
    return (f"too small: the model under {policy} and one stream need about {need / 2**30:.1f} GiB, "
            f"{free_bytes / 2**30:.1f} GiB is free")


def required_bytes(config: BreezeConfig, policy: str, capacity: int) -> int:
    """Device memory the serving model and one stream need: the weights (for fp16-mixed the FP32 load comes
    first), the codec, one stream slot and a margin for activations and workspaces."""
    load = footprint.weight_bytes(config, "fp32" if policy == "fp16-mixed" else policy)
    return load + footprint.codec_bytes() + footprint.stream_bytes(config, policy, capacity) + LOAD_MARGIN_BYTES


# ---------------------------------------------------------------- start-up and memory


def probe_startup(model, device: torch.device, load_info: dict, engine: dict) -> dict:
    """The worker's start-up after loading: its engine for one stream (compile, CUDA graph capture) and its
    warm-up (codec graphs, one short job). The runtime is left in `engine["runtime"]` for the memory probe."""
    from breeze_worker.engine.runtime import Runtime

    if model.codec is None:
        raise NotMeasured("the model has no codec, and the worker's warm-up decodes audio")
    runtime = engine["runtime"] = Runtime(model, device, "fast", "doctor")
    alloc0, resv0 = _allocated(device), _reserved(device)
    t0 = time.perf_counter()
    stepper = runtime.stepper_for(1)
    build_s = time.perf_counter() - t0
    stats = stepper.stats()
    t1 = time.perf_counter()
    runtime.warm_up(max_streams=1)
    warm_s = time.perf_counter() - t1
    total = load_info["load_s"] + (load_info["overflow_probe_s"] or 0.0) + build_s + warm_s
    return {
        "load_s": load_info["load_s"], "overflow_probe_s": load_info["overflow_probe_s"],
        "compile_s": stats["compile_s"], "capture_s": stats["capture_s"], "engine_build_s": build_s,
        "warm_up_s": warm_s, "total_s": total, "compiled": stats["compiled"], "graphs": stats["graphs"],
        "compile_fallback": stats["compile_fallback"], "graph_fallback": stats["graph_fallback"],
        "max_streams": 1, "capacity": stats["capacity"],
        "engine_allocated_bytes": _allocated(device) - alloc0, "engine_reserved_bytes": _reserved(device) - resv0,
        "caches": "cold: the doctor compiles into a temporary directory, so a worker with a persistent "
                  "TORCHINDUCTOR_CACHE_DIR restarts faster than this",
    }


def _cache_only_stepper_bytes(model, device: torch.device, slots: int) -> int:
    """Device memory a stepper of `slots` stream slots allocates without graphs or compilation: its caches
    and per-stream buffers."""
    from breeze_worker.config import FastPathSettings
    from breeze_worker.engine.batching import BatchedStepper

    release(device)
    before = _allocated(device)
    stepper = BatchedStepper(model, slots, device, use_graphs=False, shapes=[],
                             settings=FastPathSettings(compile="off"))
    used = _allocated(device) - before
    del stepper
    release(device)
    return used


def probe_memory(model, device: torch.device, policy: str, engine_reserved: int, model_bytes: int) -> dict:
    """Model, one stream slot's caches (the difference between cache-only steppers of MEMORY_SLOTS slots and of
    two, over the slots between: from two slots on a stepper holds two rows a slot, while one slot holds three,
    room for a stream with two guidance scales), the fixed rest of the 1-stream engine (graphs, workspaces,
    codec graphs), and how many slots fit."""
    from breeze_worker.doctor.figures import HEADROOM_FRACTION
    from breeze_worker.doctor.verdict import streams_that_fit

    if device.type != "cuda":
        raise NotMeasured("no CUDA device: memory per stream is a GPU figure")
    from breeze_worker.engine.precision import backbone_kv_dtype

    capacity = model.generation_defaults.max_sequence
    half_kv = backbone_kv_dtype(model.lm, True) == torch.float16  # as the worker's default settings serve
    estimate = footprint.stream_bytes(model.config, policy, capacity, half_kv=half_kv)
    free = _free(device)
    if free is not None and free < (MEMORY_SLOTS + 1) * estimate:
        raise NotMeasured(f"too little free GPU memory to measure per-stream caches ({free / 2**30:.1f} GiB free, "
                          f"about {(MEMORY_SLOTS + 1) * estimate / 2**30:.1f} GiB needed)")
    two = _cache_only_stepper_bytes(model, device, 2)
    many = _cache_only_stepper_bytes(model, device, MEMORY_SLOTS)
    per_stream = (many - two) // (MEMORY_SLOTS - 2)
    free, total = torch.cuda.mem_get_info(device)
    outside = max(0, int(total - free) - _reserved(device))  # CUDA context, libraries, other processes
    fixed = max(0, engine_reserved - per_stream) + outside
    fits = streams_that_fit(int(total), model_bytes, fixed, per_stream)
    return {"capacity": capacity, "model_bytes": model_bytes, "stream_bytes": per_stream,
            "stream_bytes_estimate": estimate, "engine_reserved_bytes": engine_reserved, "outside_bytes": outside,
            "fixed_bytes": fixed, "total_bytes": int(total), "free_bytes": int(free),
            "headroom_fraction": HEADROOM_FRACTION, "streams_fit": fits,
            "note": "each further batch bucket of the engine (2, 4, 8, ... streams) captures its own graphs, "
                    "which this count does not include"}


# ---------------------------------------------------------------- the fast path


def probe_fast_path(model, device: torch.device, floor: float | None, frames: int, repeats: int, seed: int,
                    capacity: int = 256) -> dict:
    """Batch-1 requests through the bench's runner (measure/runner.py `time_variant`: one warm-up, `repeats`
    timed), CFG on and off, end of speech masked so every request runs `frames` frames. The runner's cache holds
    `capacity` positions, as in the recorded bench runs: a frame attends over its own attention bucket whatever
    the capacity, and each larger bucket would add a compile and graph captures to the probe."""
    from breeze_worker.measure.runner import mask_end_of_speech, time_variant

    mask_end_of_speech(model)
    defaults = model.generation_defaults
    model.generation_defaults = dataclasses.replace(defaults, max_sequence=min(capacity, defaults.max_sequence))
    out = {"frames": frames, "repeats": repeats, "capacity": model.generation_defaults.max_sequence,
           "path": "fast (measure/runner.py, batch 1)"}
    for cfg in (True, False):
        name = "cfg" if cfg else "nocfg"
        v = time_variant(f"fast/{name}", "fast", cfg, model, device, frames=frames, repeats=repeats, seed=seed)
        row = {k: v.get(k) for k in FAST_KEYS}
        ms = row["ms_per_frame"]
        row["floor_ratio"] = (ms / floor) if ms and floor else None
        out[name] = row
    model.generation_defaults = defaults
    release(device)
    return out


# ---------------------------------------------------------------- precision


def precision_policies(auto_policy: str) -> list[str]:
    """The serving policy, fp16-mixed (the T4's) when that is another, fp16-mixed with the backbone's 16-bit
    caches (what a T4 serves by default), and plain FP16 for contrast."""
    out = [auto_policy]
    if auto_policy != "fp16-mixed":
        out.append("fp16-mixed")
    return out + ["fp16-mixed-kv16", "fp16"]


def probe_precision(spec: ModelSpec, device: torch.device, policies: list[str], frames: int) -> dict:
    """measure/agreement.py's teacher-forced check (KL, top-1, top-k, non-finite) on `frames` frames with CFG,
    against the FP32 model, which is loaded for it (and moved to the host once its reference is computed)."""
    from breeze_worker.measure.agreement import precision_check
    from breeze_worker.measure.setup import DEFAULT_TEXT, make_request

    config = spec.config()
    fp32 = footprint.weight_bytes(config, "fp32")
    need = fp32 + footprint.codec_bytes() + LOAD_MARGIN_BYTES
    free = _free(device)
    if free is not None and free < need:
        raise NotMeasured(f"too small for the FP32 reference: about {need / 2**30:.1f} GiB needed, "
                          f"{free / 2**30:.1f} GiB free")
    host, host_need = host_available_bytes(), 2 * fp32 + LOAD_MARGIN_BYTES  # the reference + one policy's copy
    if device.type == "cuda" and host is not None and host < host_need:
        raise NotMeasured(f"too little host memory: the check keeps the FP32 reference on the host and copies it "
                          f"per policy (about {host_need / 2**30:.1f} GiB), {host / 2**30:.1f} GiB is available")
    model, _ = load_model(spec, device, "fp32", with_codec=False)
    try:
        request = make_request(model, DEFAULT_TEXT, True, frames, spec.seed)
        result = precision_check(model, request, policies)
    finally:
        del model
        release(device)
    rows = []
    for p in result["policies"]:
        rows.append({k: p.get(k) for k in ("policy", "applied", "emulated", "note", "kept_fp32", "recipe", "error",
                                           "summary")})
    return {"frames": result["frames"], "top_k": result["top_k"], "cfg": True, "reference": "fp32",
            "policies": rows, "method": "measure/agreement.py (teacher-forced, the FP32 model's own frames)"}


# ---------------------------------------------------------------- the whole run


@dataclass
class MeasureOptions:
    frames: int = 48
    repeats: int = 3
    check_frames: int = 4
    budget_s: float = 170.0
    allow_busy: bool = False


def measure(device: torch.device, spec: ModelSpec, policy: str, *, busy_reasons: list[str],
            options: MeasureOptions) -> tuple[dict, dict[str, str]]:
    """Every probe on `device`: (measured figures by probe, reasons by probe not measured)."""
    measured: dict = {}
    missing: dict[str, str] = {}
    budget = Budget(options.budget_s)

    def run(name: str, fn, *args, **kwargs):
        try:
            budget.require(name)
            t0 = time.perf_counter()
            measured[name] = fn(*args, **kwargs)
            if isinstance(measured[name], dict):
                measured[name]["probe_s"] = time.perf_counter() - t0
            return measured[name]
        except NotMeasured as exc:
            missing[name] = str(exc)
        except torch.cuda.OutOfMemoryError as exc:
            release(device)
            missing[name] = f"out of GPU memory ({str(exc).splitlines()[0]})"
        except Exception as exc:  # noqa: BLE001 - one failed probe must not lose the others' figures
            log.exception("doctor: the %s probe failed", name)
            release(device)
            missing[name] = f"failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        return None

    if busy_reasons and not options.allow_busy:
        why = ("the GPU is busy (" + "; ".join(busy_reasons) + "): timings and memory figures would include that "
               "work; --allow-busy measures anyway")
        return measured, {name: why for name in PROBES}
    config = spec.config()
    run("copy_bandwidth", probe_bandwidth, device)
    bandwidth = (measured.get("copy_bandwidth") or {}).get("bytes_per_s")
    small = refuse_small(config, policy, _free(device))
    if small:
        measured["floor"] = {"bytes_per_frame": {"total": footprint.frame_bytes(config, policy)},
                             "floor_ms": None if not bandwidth else
                             1000.0 * footprint.frame_bytes(config, policy) / bandwidth,
                             "source": "from the configuration (the model was not loaded)"}
        missing.update({name: small for name in ("startup", "memory", "fast_path", "precision")})
        return measured, missing
    # first, while no other model is on the device: the FP32 reference needs the most memory, and the eager
    # code it runs leaves nothing cached behind (the fast path's per-model graphs would keep a model alive)
    run("precision", probe_precision, spec, device, precision_policies(policy), options.check_frames)
    alloc0 = _allocated(device)
    try:
        model, load_info = load_model(spec, device, policy)
    except Exception as exc:  # noqa: BLE001 - a model that does not load leaves the GPU figures above
        log.exception("doctor: loading the model failed")
        release(device)
        failed = f"the model did not load ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        missing.update({name: failed for name in ("floor", "startup", "memory", "fast_path")})
        return measured, missing
    model_bytes = _allocated(device) - alloc0
    measured["load"] = {**load_info, "policy": policy, "model": spec.label, "model_bytes": model_bytes}
    run("floor", probe_floor, model.lm, bandwidth, "the loaded model (measure/report.py bytes_per_frame)")
    engine: dict = {}
    run("startup", probe_startup, model, device, load_info, engine)
    if "startup" in measured:
        run("memory", probe_memory, model, device, policy, measured["startup"]["engine_reserved_bytes"],
            model_bytes)
    else:
        missing["memory"] = "the worker's engine was not built (start-up not measured)"
    engine.clear()  # the engine's caches and graphs go before the fast-path probe builds its own
    release(device)
    floor = (measured.get("floor") or {}).get("floor_ms")
    run("fast_path", probe_fast_path, model, device, floor, options.frames, options.repeats, spec.seed)
    del model
    release(device)
    return measured, missing
