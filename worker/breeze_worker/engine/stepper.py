"""What the engine thread steps: a *stepper* advances every active stream by one frame per call.

Two implementations share this interface:
- `BatchedStepper` (engine/batching.py): the fast path; all active streams in one batched frame step.
- `PerStreamStepper` (here): each stream's own frame generator (the eager reference, or the per-stream fast
  generator), stepped one after the other; the numerical reference for batching.

Contract: `join` at a frame boundary (prompt encoding and prefill happen there), `step` gives every joined
stream one outcome, `leave` frees a stream's slot (idempotent; a stream that ended in `step` has already
left). Keys are opaque (the scheduler uses its `Job` objects). `step(while_running=f)` calls `f()` at most
once, when the step's device work is queued and before the host waits for it (on the CPU: before the work),
so the caller's own host work, such as reading the previous step's audio, overlaps the step; a step that
queues no device work may not call it, so the caller runs `f` after the step if it was not called.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from breeze_worker.engine.types import EndReason, ResolvedRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepOutcome:
    """One stream's result of one step: a frame, an end, both (the last frame), or an error."""

    frame: torch.Tensor | None = None  # int64 [16] on the CPU
    end_reason: EndReason | None = None  # set when the stream ended at this step (after `frame`, if any)
    error: BaseException | None = None  # the stream failed; no frame


class Stepper(Protocol):
    max_streams: int

    def join(self, joiners: list[tuple[object, ResolvedRequest]]) -> dict[object, BaseException]: ...

    def leave(self, key: object) -> None: ...

    def step(self, while_running: Callable[[], None] | None = None) -> dict[object, StepOutcome]: ...

    def stream_info(self, key: object) -> dict: ...


class FrameSource(Protocol):
    """One stream's frame generator (engine/eager.py, engine/fastpath/generator.py): int64 [16] frames until
    it is exhausted, then `end_reason` says why (None: it ran out without saying)."""

    end_reason: EndReason | None

    def __next__(self) -> torch.Tensor: ...


class PerStreamStepper:
    """Steps each stream's own frame generator (`open_frames(params)` -> iterator of [16] frames with
    `.end_reason` and `.timings`) in turn: the pre-batching engine, kept as the reference."""

    def __init__(self, open_frames: Callable[[ResolvedRequest], FrameSource], max_streams: int):
        self.open_frames = open_frames
        self.max_streams = max_streams
        self._sources: dict[object, FrameSource] = {}
        self._info: dict[object, dict] = {}

    def __len__(self) -> int:
        return len(self._sources)

    def join(self, joiners: list[tuple[object, ResolvedRequest]]) -> dict[object, BaseException]:
        errors: dict[object, BaseException] = {}
        for key, params in joiners:
            try:
                self._sources[key] = self.open_frames(params)
                self._info[key] = {"generate_s": 0.0, "nonfinite_events": 0}
            except Exception as exc:  # noqa: BLE001 - this stream only
                errors[key] = exc
        return errors

    def leave(self, key: object) -> None:
        source = self._sources.pop(key, None)
        if source is not None and hasattr(source, "close"):
            source.close()

    def step(self, while_running: Callable[[], None] | None = None) -> dict[object, StepOutcome]:
        if while_running is not None:  # each generator computes synchronously: nothing is queued to overlap
            while_running()
        outcomes = {}
        for key, source in list(self._sources.items()):
            t0 = time.perf_counter()
            try:
                frame = next(source, None)
            except Exception as exc:  # noqa: BLE001 - this stream only
                outcomes[key] = StepOutcome(error=exc)
                self._finish(key, source)
                continue
            self._info[key]["generate_s"] += time.perf_counter() - t0
            if frame is None:
                outcomes[key] = StepOutcome(end_reason=source.end_reason or EndReason.FRAME_LIMIT)
                self._finish(key, source)
            else:
                outcomes[key] = StepOutcome(frame=frame)
        return outcomes

    def _finish(self, key: object, source) -> None:
        info = self._info[key]
        timings = getattr(source, "timings", {}) or {}
        info["text_encode_s"] = float(timings.get("text_encode_s", 0.0))
        info["prefill_s"] = float(timings.get("prefill_s", 0.0))
        # the first next() paid for text encoding and prefill
        info["generate_s"] = max(0.0, info["generate_s"] - info["text_encode_s"] - info["prefill_s"])
        info["nonfinite_events"] = int(getattr(source, "nonfinite_events", 0))
        self._sources.pop(key, None)

    def stream_info(self, key: object) -> dict:
        """text_encode_s, prefill_s, generate_s, nonfinite_events of a stream (complete once it has left)."""
        info = dict(self._info.get(key, {}))
        source = self._sources.get(key)
        if source is not None:  # left early (cancelled): take what its generator measured so far
            timings = getattr(source, "timings", {}) or {}
            info.setdefault("text_encode_s", float(timings.get("text_encode_s", 0.0)))
            info.setdefault("prefill_s", float(timings.get("prefill_s", 0.0)))
        return info

    def forget(self, key: object) -> None:
        self._info.pop(key, None)
