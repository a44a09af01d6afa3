"""What the engine thread runs on: the loaded model and codec, the device, and the decode path.

`Runtime.load(settings)` loads once per process (the tiny embedded default when no checkpoint is given),
picks the device and the decode path (fast on CUDA, eager on the CPU), builds the stepper the engine
thread drives (fast: `BatchedStepper`, every active stream in one batched frame step, its CUDA graphs
captured here; eager: `PerStreamStepper`, each stream's own eager generator, the reference) and warms up.

With the `startup` setting's `progressive` (the default), `load` builds only what one stream needs and
`start_background` builds the rest while the worker serves (engine/startup.py); `readiness()` says how far it
is. With `whole`, `load` builds everything, as a worker that serves only once it is complete.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from breeze_worker.config import EngineSettings, FastPathSettings
from breeze_worker.engine.types import PcmEncoding, ResolvedRequest, SamplingParams, Template

if TYPE_CHECKING:
    from breeze_worker.engine.bundle import Bundle
    from breeze_worker.engine.startup import StartupBuild
    from breeze_worker.engine.stepper import FrameSource, Stepper

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    """`auto` takes the first CUDA device when there is one, else the CPU; `cuda[:N]` must exist."""
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: no CUDA device is visible on this host; use --device cpu")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device


def configure_codec_convolutions(device: torch.device, tf32: bool) -> bool:
    """Process-wide: the codec's cuDNN convolutions in true FP32, or TF32 where `tf32` (the `codec_tf32`
    setting) asks for it and the device has it (engine/precision.py `codec_tf32_wanted`). The worker and every
    bench call this with their settings, so a bench measures what the worker serves. Returns whether TF32
    is on."""
    from breeze_worker.engine.precision import codec_tf32_wanted, device_capability

    if device.type != "cuda":
        return False
    torch.backends.cudnn.allow_tf32 = codec_tf32_wanted(device_capability(device), tf32)
    if torch.backends.cudnn.allow_tf32:
        log.info("codec convolutions in TF32 (codec_tf32 setting)")
    return torch.backends.cudnn.allow_tf32


def codec_compile_slots(settings: EngineSettings, device: torch.device) -> int:
    """The smallest codec slot bucket compiled (0: none): the `codec_compile_slots` setting on CUDA. Not on the
    CPU, where Inductor builds C++ for minutes and nothing is captured; there the setting is ignored."""
    return settings.codec_compile_slots if device.type == "cuda" else 0


TINY_DEFAULT_WARNING = ("this worker serves the TINY EMBEDDED DEFAULT model (random weights): its audio is NOT "
                        "speech; start it with --model DIR for real synthesis")
SYNTHETIC_WARNING = ("this worker serves a SYNTHETIC checkpoint (random weights, written by breeze-worker "
                     "make-checkpoint): its audio is NOT speech, its timings are the real shapes'; start it with "
                     "--model DIR of a Breeze TTS 2 download for real synthesis")


class Runtime:
    """The loaded model, codec and decode path for one worker process."""

    def __init__(self, model, device: torch.device, decode_path: str, description: str,
                 codec_compile_slots: int = 0, fastpath: FastPathSettings | None = None):
        self.model = model  # breeze_worker.model.loaded.LoadedModel
        self.codec = model.codec
        self.device = device
        self.decode_path = decode_path  # "eager" or "fast"
        self.description = description
        self.sample_rate = int(self.codec.sample_rate)
        self.warmup_s = 0.0
        self.stepper: Stepper | None = None  # built by `load` (or on first `stepper_for`)
        self.codec_compile_slots = codec_compile_slots  # the `codec_compile_slots` setting (0: never)
        self.fastpath = fastpath or FastPathSettings()  # the fast path's settings (EngineSettings.fastpath)
        self.precision = "fp32"  # the language model's precision policy (set by `load`; the codec is always FP32)
        self.progressive = False  # build what one stream needs first, the rest while serving
        self.startup: StartupBuild | None = None  # the rest's build (`start_background`)
        self.max_streams = 1
        self.bundle: Bundle | None = None  # the compile bundle, its parts not installed yet (engine/bundle.py)

    @property
    def is_tiny_default(self) -> bool:
        return bool(self.model.is_tiny_default)

    @property
    def not_speech_warning(self) -> str:
        """What users are told when the weights are random, so the audio is not speech ("" otherwise)."""
        if self.model.is_tiny_default:
            return TINY_DEFAULT_WARNING
        return SYNTHETIC_WARNING if self.model.synthetic else ""

    @classmethod
    def load(cls, settings: EngineSettings) -> Runtime:
        from breeze_worker.engine.precision import choose_policy

        device = pick_device(settings.device)
        configure_codec_convolutions(device, settings.codec_tf32)
        policy = choose_policy(settings.precision, device, force=settings.force_precision)
        t0 = time.perf_counter()
        if settings.model_dir is None:
            from breeze_worker.model.tiny import tiny_model

            model = tiny_model(seed=0, device=device)
            description = "tiny embedded default (random weights: its audio is NOT speech)"
        else:
            from breeze_worker.model.loader import load_checkpoint

            model = load_checkpoint(settings.model_dir, device=device, dtype=policy.weight_dtype)
            description = (f"synthetic checkpoint {settings.model_dir} (random weights: its audio is NOT speech)"
                           if model.synthetic else f"Breeze TTS 2 checkpoint {settings.model_dir}")
        kept = _apply_precision(model, policy, device)
        description += f"; precision {policy.name}" + (f" ({len(kept)} layers kept in FP32)" if kept else "")
        if model.codec is not None and settings.codec_precision != "fp32":  # the codec_precision setting
            model.codec.set_precision(settings.codec_precision)
            description += f"; codec {settings.codec_precision}"
        bundle = None
        if settings.compile_bundle is not None:
            from breeze_worker.engine.bundle import bundle_key, open_bundle

            bundle = open_bundle(settings.compile_bundle, bundle_key(settings, model, device, policy.name))
        decode_path = settings.fast_path
        if decode_path == "auto":
            decode_path = "fast" if device.type == "cuda" else "eager"
        runtime = cls(model, device, decode_path, description,
                      codec_compile_slots=codec_compile_slots(settings, device), fastpath=settings.fastpath)
        runtime.precision = policy.name
        log.info("model loaded in %.2f s on %s: %s; decode path %s; precision: %s", time.perf_counter() - t0,
                 device, description, decode_path, policy.reason)
        runtime.progressive = settings.startup == "progressive" and decode_path == "fast"
        runtime.max_streams = settings.max_active_streams
        runtime.bundle = bundle
        if bundle is not None:  # the torch cache before the first compile: now, or first thing while serving
            compiles_now = not runtime.progressive or 0 < runtime.codec_compile_slots <= 1
            bundle.install(bundle.pending if compiles_now else tuple(p for p in bundle.pending if p != "torch-cache"))
        runtime.stepper_for(settings.max_active_streams)
        runtime.warm_up(max_streams=1 if runtime.progressive else settings.max_active_streams)
        return runtime

    # ---- the rest of the start-up, while serving ----
    def start_background(self, on_progress=None) -> None:
        """Build what `load` left (progressive start) on a thread of its own; `on_progress()` after each piece."""
        from breeze_worker.engine.startup import StartupBuild

        if self.startup is None:
            self.startup = StartupBuild(self, self.max_streams)
            self.startup.start(on_progress)

    def stop_background(self, timeout: float = 30.0) -> None:
        if self.startup is not None:
            self.startup.stop(timeout)

    @property
    def ready_streams(self) -> int:
        """Streams the engine may decode at once now (fewer than configured while the start-up builds)."""
        return min(self.max_streams, int(getattr(self.stepper, "ready_streams", self.max_streams)))

    def readiness(self) -> dict:
        """How much of the configured capacity is ready: streams, batch shapes, codec batches, what is being
        built, and the steps that ran on a slower form than configured (by kind)."""
        stepper, build = self.stepper, self.startup
        graphs = getattr(stepper, "graphs", None)
        pending = graphs.pending() if graphs is not None else []
        building = build.building if build is not None else None
        doc = {"configured_streams": self.max_streams, "ready_streams": self.ready_streams,
               "complete": not pending and (build is None or build.done.is_set()),
               "building": building or "", "failed": build.failed if build is not None else None,
               "fallback_steps": dict(getattr(stepper, "fallback_steps", {}))}
        if graphs is not None:
            doc["batch_shapes"] = {"ready": len(graphs.ready_shapes), "configured": len(graphs.shapes),
                                   "compiled": sum(b.view.compiled for b in list(graphs.built.values())),
                                   "pending": len(pending)}
        if self.decode_path == "fast":
            from breeze_worker.engine.codec_graphs import pool_for

            doc["codec_batches"] = sorted(pool_for(self.codec).built)
        if build is not None and build.finished_at is not None and build.started_at is not None:
            doc["background_s"] = build.finished_at - build.started_at
        if self.bundle is not None:
            doc["compile_bundle"] = {"path": str(self.bundle.path), "installed": dict(self.bundle.installed)}
        return doc

    # ---- the engine thread's stepper ----
    def stepper_for(self, max_streams: int):
        """The stepper for up to `max_streams` concurrent streams (built once; rebuilt only if too small)."""
        if self.stepper is None or self.stepper.max_streams < max_streams:
            if self.decode_path == "fast":
                from breeze_worker.engine.batching import BatchedStepper

                self.stepper = BatchedStepper(self.model, max_streams, self.device, settings=self.fastpath,
                                              progressive=self.progressive)
            else:
                from breeze_worker.engine.stepper import PerStreamStepper

                self.stepper = PerStreamStepper(self.open_frames, max_streams)
        return self.stepper

    # ---- per job ----
    def open_frames(self, params: ResolvedRequest) -> FrameSource:
        """An iterator of int64 [16] frames with `.end_reason` and `.timings` (eager or fast path)."""
        if self.decode_path == "fast":
            from breeze_worker.engine.fastpath.generator import FastFrameGenerator

            return FastFrameGenerator(self.model, params, self.device, settings=self.fastpath)
        from breeze_worker.engine.eager import EagerFrameGenerator

        return EagerFrameGenerator(self.model, params, self.device)

    # ---- start-up ----
    def warm_up(self, frames: int = 3, max_streams: int = 1) -> None:
        """Run a short job through the whole path so the first real request pays no first-call costs; the
        codec's graphs for every batch bucket up to `max_streams` are captured (those of at least
        `codec_compile_slots` slots first compiled) here too."""
        t0 = time.perf_counter()
        params = _probe_request(frames)
        from breeze_worker.engine.codec_graphs import pool_for
        from breeze_worker.engine.codec_rows import CodecRows

        pool_for(self.codec, compile_from=self.codec_compile_slots)  # the engine's CodecRows take its batches
        rows = CodecRows(self.codec)
        codec_s = rows.prepare(max_streams)
        if codec_s > 0.01:
            log.info("codec graphs for up to %d streams ready in %.2f s", max_streams, codec_s)
        rows.add("warm-up")
        stepper = self.stepper_for(1)
        errors = stepper.join([("warm-up", params)])
        if errors:
            raise errors["warm-up"]
        while True:
            outcome = stepper.step()["warm-up"]
            if outcome.error is not None:
                raise outcome.error
            if outcome.frame is not None:
                rows.decode({"warm-up": outcome.frame})
            if outcome.end_reason is not None:
                break
        stepper.leave("warm-up")
        getattr(stepper, "forget", lambda key: None)("warm-up")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.warmup_s = time.perf_counter() - t0
        log.info("warm-up done in %.2f s", self.warmup_s)


def _apply_precision(model, policy, device: torch.device) -> list[str]:
    """Convert the language model to `policy` (the codec stays FP32). For fp16-mixed, first run a short
    FP32 reference with forward hooks and keep in FP32 every linear layer whose activations come near the
    FP16 limit on it."""
    from breeze_worker.engine.precision import apply_policy, find_overflowing_layers

    keep: list[str] = []
    if policy.mixed:
        from breeze_worker.engine.eager import EagerFrameGenerator

        probe = _probe_request(frames=4)
        peaks = find_overflowing_layers(model.lm, lambda: list(EagerFrameGenerator(model, probe, device)))
        keep = sorted(peaks)
    apply_policy(model.lm, policy, keep_fp32=keep)
    return keep


def _probe_request(frames: int) -> ResolvedRequest:
    """A short fixed request used for warm-up and for the FP16 overflow probe."""
    return ResolvedRequest(
        text="A short sentence to warm up the model.", instruction=None, cfg_scale=1.0, seed=1,
        template=Template.PLAIN, sampling=SamplingParams(), max_frames=frames, encoding=PcmEncoding.S16LE,
        frames_per_chunk=1,
    )
