"""`FastFrameGenerator`: the fast decode path behind the eager generator's interface.

Prompt preparation is engine/prompt.py's, as the eager path's, with the text encoder replayed from a graph
per length bucket (fastpath/text_encoder_graphs.py); the backbone prefill runs once into the static cache,
replayed from a graph per prompt-length bucket (the prompt left-padded to it, FrameRunner.prefill); then
each frame is one replay of the sampling graph, ONE host read
(16 codes + end-of-speech flag + non-finite flag, read together), and one replay of the backbone graph for
the next frame, queued before the frame is handed out: by default already before the host read
(FrameRunner.sample_frame), so the device does not idle while the host reads and decides. When the frame
ends the request (end of speech, non-finite values) that step's work is discarded with the runner's state.

Trace spans (engine/tracing.py, recorded only while a tracer is active): text_encode, prefill, then per
frame `frame` > `fast_step` (the sampling half: a graph replay, or with graphs off its own spans from
FrameStep.sample_frame, plus the one host read) and `backbone_step` (the next frame's backbone step, queued
before the frame is handed out). Like the eager path's, a frame span stays open across the `yield`, so it
contains what the consumer does with the frame (codec decode, emit) and ends when the next frame is asked for.

Fail-safe: a frame whose logits held NaN/Inf anywhere (codebook 0 or any depth step) is never emitted.
The event is counted (`nonfinite_events()` for the process, `.nonfinite_events` per generator) and the
request ends with `NumericalError`: recomputing in the same precision would reproduce the same values. This
per-stream generator serves the benches and tools; the worker's batched engine recomputes such a frame at a
safe precision and goes on (engine/fastpath/recovery.py).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import torch

from breeze_worker.config import FastPathSettings
from breeze_worker.engine import tracing
from breeze_worker.engine.fastpath.graph import acquire_runner, release_runner
from breeze_worker.engine.fastpath.step import READOUT_EOS, READOUT_NONFINITE, stream_setup
from breeze_worker.engine.fastpath.text_encoder_graphs import text_encoder_graphs
from breeze_worker.engine.prompt import prepare_prompt_embeddings, prompt_layouts, prompt_text_segments
from breeze_worker.engine.sampling import RowSampling
from breeze_worker.engine.types import EndReason, ResolvedRequest
from breeze_worker.errors import NumericalError
from breeze_worker.model.loaded import LoadedModel

log = logging.getLogger(__name__)

_NONFINITE = itertools.count()
_NONFINITE_LOCK = threading.Lock()
_nonfinite_total = 0


def nonfinite_events() -> int:
    """Frames discarded in this process because their logits were not finite."""
    return _nonfinite_total


def _count_nonfinite() -> None:
    global _nonfinite_total
    with _NONFINITE_LOCK:
        _nonfinite_total += 1


class FastFrameGenerator:
    """Iterate to get int64 [16] CPU frames; `.end_reason` is set once the iterator is exhausted."""

    def __init__(self, model: LoadedModel, request: ResolvedRequest, device: torch.device | str | None = None,
                 *, settings: FastPathSettings | None = None, eos_masked: bool = False, timed_stages: bool = False):
        self.model, self.request = model, request
        self.device = torch.device(device) if device is not None else model.device
        self.settings = settings or FastPathSettings()  # compile, form, sampler, kernels, read overlap
        self.eos_masked = eos_masked  # bench only: never end of speech (the frame limit ends the request)
        self.timed_stages = timed_stages  # bench: wait for the device at stage ends so the split is exact
        self.end_reason: EndReason | None = None
        self.frames_emitted = 0
        self.nonfinite_events = 0
        self.host_reads = 0
        self.timings = {"text_encode_s": 0.0, "prefill_s": 0.0, "generate_s": 0.0}
        self.runner = None
        self.compiled = self.graphs = None
        self.fallback_reason = self.compile_fallback_reason = None
        self._frames = self._run()

    def __iter__(self) -> FastFrameGenerator:
        return self

    def __next__(self) -> torch.Tensor:
        return next(self._frames)

    def close(self) -> None:
        self._frames.close()

    def _check(self, readout: torch.Tensor, frame_index: int) -> bool:
        """The frame's flags: raises NumericalError (counted) on non-finite logits; True at end of speech."""
        if bool(readout[READOUT_NONFINITE]):
            self.nonfinite_events += 1
            _count_nonfinite()
            self.end_reason = EndReason.ERROR
            log.error("frame %d of a request produced non-finite logits; it was not emitted", frame_index)
            raise NumericalError(
                f"non-finite values in the model's logits at frame {frame_index} (this precision policy); the "
                "frame was discarded. The same request and seed reproduce it, so retrying it will not help: run "
                "with --precision fp32, or through the batched engine, which recomputes such a frame")
        if bool(readout[READOUT_EOS]):
            self.end_reason = EndReason.END_OF_SPEECH
            return True
        return False

    def _stage_end(self) -> None:
        if self.timed_stages and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def _run(self):
        model, request = self.model, self.request
        t0 = time.perf_counter()
        with tracing.span("text_encode"):  # setup, not a frame (measure/syncaudit.py)
            encoder = text_encoder_graphs(model.lm, self.device)
            layouts = prompt_layouts(model, request)  # the request's own, laid out when it was resolved
            prompt = prepare_prompt_embeddings(model, request, encoded=encoder.encode_segments(
                prompt_text_segments(model, request, layouts)), layouts=layouts)
            self._stage_end()
        t1 = time.perf_counter()
        self.timings["text_encode_s"] = t1 - t0
        rows, length = prompt.inputs_embeds.shape[:2]
        capacity = model.generation_defaults.max_sequence
        limit = min(request.max_frames, capacity - 1 - length)
        frame_spans = None
        runner = self.runner = acquire_runner(model.lm, rows, capacity, self.device, self.settings)
        # what the runner serves with, kept after it is released (bench and logs)
        self.compiled, self.graphs = runner.compiled, runner.use_graphs
        self.fallback_reason, self.compile_fallback_reason = runner.fallback_reason, runner.compile_fallback_reason
        try:
            step = runner.step
            sampling = RowSampling.from_params([request.sampling], [request.seed], "cpu")  # set_stream fills them
            step.set_streams([stream_setup(0, list(range(rows)), request, sampling, self.eos_masked)])
            slots = runner.prompt_slots(length, limit)  # the prompt's cache slots (padded to a bucket)
            with tracing.span("prefill"):
                runner.prefill(prompt.inputs_embeds, prompt.positions, prompt.attention_mask, slots)
                self._stage_end()
            self.timings["prefill_s"] = time.perf_counter() - t1
            frame_index = 0
            graphs = bool(runner.use_graphs)
            frame_spans = tracing.span_sequence("frame")
            while frame_index < limit:
                started = time.perf_counter()
                frame_spans.next(index=frame_index)

                def next_backbone(index=frame_index + 1):  # the next frame's backbone step (writes its slot)
                    with tracing.span("backbone_step", for_frame=index, graph=graphs):
                        runner.backbone_step(slots + index - 1)

                with tracing.span("fast_step", index=frame_index, graph=graphs):
                    # with a next frame the runner may queue its backbone step before the read (graph.py)
                    readout, queued = runner.sample_frame(next_backbone if frame_index + 1 < limit else None)
                    readout = readout[0]
                self.host_reads += 1
                if self._check(readout, frame_index):
                    self.timings["generate_s"] += time.perf_counter() - started
                    return
                frame_index += 1
                if frame_index < limit and not queued:  # it runs while the caller decodes this frame
                    next_backbone()
                self.timings["generate_s"] += time.perf_counter() - started
                self.frames_emitted += 1
                yield readout[:READOUT_EOS].clone()
            self.end_reason = EndReason.FRAME_LIMIT
        finally:
            if frame_spans is not None:
                frame_spans.close()
            self.runner = None
            if self.nonfinite_events:  # its caches hold what the bad step computed (FrameStep.scrub)
                runner.step.scrub()
            release_runner(model.lm, runner)
