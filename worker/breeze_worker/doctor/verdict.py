"""The verdict: pure functions from `Figures` to numbers and sentences (no device, no model, no clock).

The model behind every projection (stated in the report next to its figures):
- a frame's language-model time is the byte floor (the weights it streams / bandwidth) plus an overhead
  above the floor (launch gaps, small-kernel latency, sampling), carried over from the reference device
  unchanged: a lower bound, since a slower GPU runs small kernels more slowly too;
- a batched step of N streams (half with CFG, N + ceil(N/2) model rows) adds the reference's measured growth
  of that overhead, and becomes compute-bound only where its GEMMs (2 FLOPs per weight per row) at
  `COMPUTE_EFFICIENCY` of the datasheet peak take longer than the floor;
- the codec (strict FP32) costs the reference's batch-1 time plus its growth with N scaled by the ratio of FP32
  throughputs; in its fp16-mixed precision (FP16 convolutions, `half_codec`) by the ratio of the reference's
  FP32 throughput to the device's FP16 tensor-core throughput (the growth taken as the convolutions' arithmetic);
- a stream's RTF at N streams is the step time / 80 ms; the aggregate is N x 80 ms / step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from breeze_worker.doctor.figures import (
    COMPUTE_EFFICIENCY,
    FRAME_MS,
    HEADROOM_FRACTION,
    RTF_TARGET,
    STOP_RATIO,
    STREAM_LEVELS,
    BatchedPoint,
    Figures,
    GpuClass,
    ReferenceRun,
)


def floor_ms(bytes_per_frame: int, bandwidth: float | None) -> float | None:
    """The byte floor of a frame: every weight it uses streamed once, at `bandwidth` bytes/s."""
    return None if not bandwidth else 1000.0 * bytes_per_frame / bandwidth


def rtf(ms_per_frame: float) -> float:
    """Wall time / audio time of a stream that takes `ms_per_frame` per 80 ms frame."""
    return ms_per_frame / FRAME_MS


def x_realtime(streams: int, step_ms: float) -> float:
    """Audio seconds produced per wall second by `streams` streams advancing one frame per `step_ms`."""
    return streams * FRAME_MS / step_ms


def rows_for(streams: int) -> int:
    """Model rows of `streams` streams of which half (rounded up, the first included) use CFG."""
    return streams + (streams + 1) // 2


def policy_for(capability: tuple[int, int] | None) -> str:
    """The precision `auto` serves on a device of `capability` (engine/precision.py's table)."""
    from breeze_worker.engine.precision import policy_for_capability

    return policy_for_capability(capability)


def compute_ms(rows: int, params_per_frame: float, half_tflops: float,
               efficiency: float = COMPUTE_EFFICIENCY) -> float:
    """Time the step's GEMMs need if compute bound: 2 FLOPs per weight per row."""
    return 1000.0 * 2.0 * params_per_frame * rows / (half_tflops * 1e12 * efficiency)


def project_batched(lm1_ms: float, codec1_ms: float, floor: float, params_per_frame: float, half_tflops: float,
                    codec_tflops: float, reference: ReferenceRun) -> tuple[BatchedPoint, ...]:
    """The step at each of `STREAM_LEVELS` streams on a device whose batch-1 LM time is `lm1_ms` (byte floor
    `floor`) and codec time `codec1_ms`, its codec's convolutions running at `codec_tflops` (its FP32 peak, or
    its FP16 tensor-core peak for the half-precision codec; module docstring)."""
    points = []
    for n in STREAM_LEVELS:
        bound = max(floor, compute_ms(rows_for(n), params_per_frame, half_tflops))
        lm = bound + (lm1_ms - floor) + reference.overhead_growth_ms(n)
        codec = codec1_ms + reference.codec_growth_ms(n) * reference.fp32_tflops / codec_tflops
        points.append(BatchedPoint(n, lm, codec))
    return tuple(points)


def streams_that_fit(memory_bytes: int | None, model_bytes: int | None, fixed_bytes: int | None,
                     stream_bytes: int | None, headroom: float = HEADROOM_FRACTION) -> int | None:
    """Stream slots whose caches fit beside the model and the fixed overhead, `headroom` of memory left free."""
    if memory_bytes is None or model_bytes is None or fixed_bytes is None or not stream_bytes:
        return None
    spare = memory_bytes * (1.0 - headroom) - model_bytes - fixed_bytes
    return max(0, math.floor(spare / stream_bytes))


def streams_within(batched: tuple[BatchedPoint, ...], limit: float, max_streams: int | None = None
                   ) -> BatchedPoint | None:
    """The most streams (of the levels in `batched`) whose per-stream RTF stays <= `limit`, at most
    `max_streams`; None when not even the smallest level does."""
    ok = [p for p in batched if rtf(p.step_ms) <= limit and (max_streams is None or p.streams <= max_streams)]
    return max(ok, key=lambda p: p.streams, default=None)


def best_throughput(batched: tuple[BatchedPoint, ...], limit: float = 1.0, max_streams: int | None = None
                    ) -> BatchedPoint | None:
    """The level with the highest aggregate x real time among those where every stream keeps RTF <= `limit`."""
    ok = [p for p in batched if rtf(p.step_ms) <= limit and (max_streams is None or p.streams <= max_streams)]
    return max(ok, key=lambda p: x_realtime(p.streams, p.step_ms), default=None)


def cost_per_audio_hour(price_per_hour: float, x_rt: float) -> float:
    """Dollars per hour of audio at `x_rt` audio hours per GPU hour."""
    return price_per_hour / x_rt


REACHED, NOT_REACHED, UNDECIDED = "reached", "not reached", "undecided"


@dataclass(frozen=True)
class Stop:
    """The stop condition: the LM time over its byte floor, against `STOP_RATIO`.

    `measured`: the LM time and the bandwidth of the floor were both measured on the device the verdict speaks
    for. Only then can the condition be `reached`. A projected LM time is a lower bound (the floor plus the
    reference device's overhead), so a projected ratio above the threshold shows `not reached` (the true one is
    higher still) and a projected ratio at or below it decides nothing (`undecided`): measure."""

    lm_ms: float
    floor_ms: float
    ratio: float
    stop_ratio: float
    measured: bool
    state: str  # REACHED | NOT_REACHED | UNDECIDED

    @property
    def stop(self) -> bool:
        """True only when measured on this device: more kernel work cannot pay here."""
        return self.state == REACHED

    @property
    def overhead_ms(self) -> float:
        return self.lm_ms - self.floor_ms


def stop_condition(lm_ms: float | None, floor: float | None, stop_ratio: float = STOP_RATIO,
                   measured: bool = True) -> Stop | None:
    """The stop condition from an LM time and a byte floor; `measured` False when either is a projection."""
    if lm_ms is None or not floor:
        return None
    ratio = lm_ms / floor
    if ratio > stop_ratio:
        state = NOT_REACHED
    else:
        state = REACHED if measured else UNDECIDED
    return Stop(lm_ms=lm_ms, floor_ms=floor, ratio=ratio, stop_ratio=stop_ratio, measured=measured, state=state)


@dataclass(frozen=True)
class HostContext:
    """What the verdict needs beyond the figures: facts about the host and the other probes' outcomes."""

    busy: bool = False
    emulates_bf16: bool | None = None
    nonfinite: bool | None = None  # the serving policy produced non-finite logits in the agreement check
    startup_s: float | None = None
    compile_s: float | None = None
    measured: bool = True  # False: every figure is a projection (the CPU, or a GPU the doctor could not use)


@dataclass
class Verdict:
    batch1_ms: float | None
    rtf_batch1: float | None
    floor_ms: float | None
    stop: Stop | None
    fits: int | None
    within: BatchedPoint | None  # most streams at RTF <= the target
    best: BatchedPoint | None  # best aggregate with every stream at RTF <= 1
    rtf_target: float
    cost: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


def _how(fig: Figures, name: str, context: HostContext) -> str:
    return "projected" if (not context.measured or name in fig.projected) else "measured"


def verdict(fig: Figures, context: HostContext = HostContext(), price_per_hour: float | None = None,
            rtf_target: float = RTF_TARGET) -> Verdict:
    floor = floor_ms(fig.bytes_per_frame, fig.bandwidth)
    batch1 = None if fig.lm_ms_cfg is None else fig.lm_ms_cfg + (fig.codec_ms or 0.0)
    fits = streams_that_fit(fig.memory_bytes, fig.model_bytes, fig.fixed_bytes, fig.stream_bytes)
    within = streams_within(fig.batched, rtf_target, fits)
    best = best_throughput(fig.batched, 1.0, fits)
    measured = context.measured and not ({"lm_ms_cfg", "bandwidth"} & fig.projected)
    out = Verdict(batch1_ms=batch1, rtf_batch1=None if batch1 is None else rtf(batch1), floor_ms=floor,
                  stop=stop_condition(fig.lm_ms_cfg, floor, measured=measured), fits=fits, within=within,
                  best=best, rtf_target=rtf_target)
    if price_per_hour is not None:
        if batch1:
            out.cost["batch1_per_audio_hour"] = cost_per_audio_hour(price_per_hour, x_realtime(1, batch1))
        if best is not None:
            out.cost["batched_per_audio_hour"] = cost_per_audio_hour(price_per_hour,
                                                                     x_realtime(best.streams, best.step_ms))
            out.cost["batched_streams"] = best.streams
        out.cost["price_per_hour"] = price_per_hour
    out.lines = _lines(fig, out, context)
    out.next_steps = next_steps(fig, out, context)
    return out


def _lines(fig: Figures, v: Verdict, context: HostContext) -> list[str]:
    lines = []
    if v.batch1_ms is not None:
        codec = (f" + codec {fig.codec_ms:.2f}" if fig.codec_ms is not None else " (codec not included)")
        lines.append(f"RTF at batch 1 (one stream, CFG on): {v.rtf_batch1:.3f} ({_how(fig, 'lm_ms_cfg', context)}: "
                     f"LM {fig.lm_ms_cfg:.2f}{codec} = {v.batch1_ms:.2f} ms per 80 ms frame)")
    else:
        lines.append("RTF at batch 1: not known (the fast path was not measured and nothing projects it)")
    fit = "" if v.fits is None else f"; memory holds {v.fits} stream slots with {HEADROOM_FRACTION:.0%} left free"
    if not fig.batched:
        lines.append(f"streams at RTF <= {v.rtf_target}: not projected (no batched figures for this device){fit}")
    elif v.within is None:
        first = fig.batched[0]
        if v.fits == 0:
            why = "not even one stream slot fits in memory beside the model"
        else:
            why = f"a single stream already takes {first.step_ms:.1f} ms a step, RTF {rtf(first.step_ms):.2f}"
        lines.append(f"streams at RTF <= {v.rtf_target}: none ({why}){fit}")
    else:
        p = v.within
        lines.append(f"streams at RTF <= {v.rtf_target}: {p.streams} (projected step {p.step_ms:.1f} ms = LM "
                     f"{p.lm_ms:.1f} + codec {p.codec_ms:.1f}; {x_realtime(p.streams, p.step_ms):.1f}x real time "
                     f"in all){fit}")
    if v.best is not None and (v.within is None or v.best.streams != v.within.streams):
        b = v.best
        lines.append(f"most audio with every stream real time (RTF <= 1): {b.streams} streams, "
                     f"{x_realtime(b.streams, b.step_ms):.1f}x real time in all (projected step {b.step_ms:.1f} ms)")
    if v.stop is None:
        lines.append("stop condition: not known (the LM time or the byte floor is missing)")
    else:
        lines.append(_stop_line(v.stop))
    cost = v.cost
    if "price_per_hour" in cost:
        parts = []
        if "batch1_per_audio_hour" in cost:
            parts.append(f"${cost['batch1_per_audio_hour']:.3f} per audio hour at batch 1")
        if "batched_per_audio_hour" in cost:
            parts.append(f"${cost['batched_per_audio_hour']:.4f} at {cost['batched_streams']} streams")
        lines.append(f"cost at ${cost['price_per_hour']:.3f}/h: " + (", ".join(parts) if parts else "not known"))
    return lines


def _stop_line(s: Stop) -> str:
    head = f"stop condition (LM <= {s.stop_ratio}x the byte floor): LM {s.lm_ms:.2f} ms = {s.ratio:.2f}x the floor of "
    if s.measured:
        state = ("reached: more kernel work cannot pay here" if s.stop
                 else f"not reached: removing every ms above the floor would make the LM up to {s.ratio:.2f}x faster")
        return f"{head}{s.floor_ms:.2f} ms (LM time and copy bandwidth measured here); {state}"
    if s.state == NOT_REACHED:
        state = ("not reached, even on the projection: its LM time is a lower bound, so the measured ratio can "
                 "only be higher")
    else:
        state = ("undecided: the projected LM time is a lower bound, which cannot show the condition reached; "
                 "measure the LM time and the copy bandwidth on the GPU itself (`breeze-worker doctor --device cuda`)")
    return f"{head}{s.floor_ms:.2f} ms (projected: the LM time a lower bound); {state}"


def next_steps(fig: Figures, v: Verdict, context: HostContext) -> list[str]:
    """What to do next on this host, most important first."""
    steps = []
    if context.busy:
        steps.append("re-run `breeze-worker doctor` on an idle GPU: other work on this one makes every timing "
                     "and memory figure here unreliable")
    if context.nonfinite:
        steps.append("the serving precision produced non-finite logits on this model: serve with --precision fp32 "
                     "and run `breeze-worker precision-check --model DIR --per-step` to find where")
    if context.emulates_bf16:
        steps.append("serve with --precision auto (fp16-mixed here): BF16 is emulated below compute capability 8.0; "
                     "never --force-precision bf16 on this GPU")
    s = v.stop
    if s is not None and s.stop:  # measured on this device (Stop.stop)
        steps.append(f"stop optimizing kernels on this GPU: the weights' bytes bound a frame at {s.floor_ms:.1f} ms "
                     f"(RTF {rtf(s.floor_ms):.2f} before any codec work) and only {s.overhead_ms:.1f} ms is above it; "
                     "to go faster read fewer bytes per frame (weight-only quantization, not in this project) or "
                     "move to a GPU with more memory bandwidth (compare classes: `breeze-worker doctor "
                     "--price-per-hour CLASS=PRICE,...`)")
    elif s is not None and s.measured:
        steps.append(f"the LM spends {s.overhead_ms:.1f} ms a frame above its byte floor: profile it with "
                     "`breeze-worker bench --paths fast --cfg on` (GPU-busy fraction, top kernels) and "
                     "`breeze-worker trace --path fast`; keep host syncs at one a frame "
                     "(`breeze-worker audit-syncs --path fast --budget 1`)")
    elif s is not None:
        steps.append(f"measure before deciding anything on kernels: on the {fig.device} itself run `breeze-worker "
                     "doctor --device cuda --json doctor.json` (the fast path's ms per frame, the copy bandwidth and "
                     f"the ratio to the floor; projected here {s.ratio:.2f}x from a lower bound) and "
                     "`breeze-worker bench --size full --device cuda --paths eager,fast --cfg on` (the GPU-busy "
                     "fraction: near 1, kernels and bytes limit the frame; small, the host does)")
    if v.within is not None and v.within.streams > 1:
        steps.append(f"serve {v.within.streams} streams at once (`breeze-worker serve --max-active-streams "
                     f"{v.within.streams}`): batching costs little per extra stream while the step is bound by "
                     "the weights' bytes")
    elif v.within is None and v.best is not None:
        steps.append(f"RTF <= {v.rtf_target} is out of reach here, but up to {v.best.streams} streams stay real "
                     f"time: serve them batched (`--max-active-streams {v.best.streams}`) for throughput, or a "
                     "faster GPU class for latency")
    if v.fits is not None and v.within is not None and v.fits <= v.within.streams:
        steps.append(f"memory, not speed, limits the streams here ({v.fits} slots fit)")
    if context.startup_s is not None and v.batch1_ms:
        frames = context.startup_s * 1000.0 / v.batch1_ms
        compiled = f", {context.compile_s:.0f} s of it compiling" if context.compile_s else ""
        steps.append(f"keep the worker long-lived: its start-up took {context.startup_s:.0f} s{compiled}, the time "
                     f"of {frames:,.0f} frames ({frames * FRAME_MS / 1000.0:,.0f} s of audio) at batch 1")
    return steps


def project_class(c: GpuClass, reference: ReferenceRun, *, params_per_frame: float, model_bytes: dict[str, int],
                  stream_bytes: dict[str, int], half_codec: bool = False) -> Figures:
    """A GPU class's figures projected from the reference (module docstring): its `auto` policy's bytes per frame
    at its datasheet bandwidth, the reference's overhead, the model and cache footprints given per policy;
    `half_codec`: the codec's convolutions in FP16 (scaled by the class's FP16 tensor-core peak)."""
    policy = policy_for(c.capability)
    bytes_per_frame = reference.bytes_per_frame[policy]
    floor = floor_ms(bytes_per_frame, c.bandwidth)
    if floor is None:  # a datasheet bandwidth of 0
        raise ValueError(f"GPU class {c.name} has no bandwidth to project its figures from")
    lm1 = floor + reference.overhead_ms(policy)
    codec1 = reference.batched[0].codec_ms
    batched = project_batched(lm1, codec1, floor, params_per_frame, c.half_tflops,
                              c.half_tflops if half_codec else c.fp32_tflops, reference)
    fields = {"bandwidth", "lm_ms_cfg", "codec_ms", "memory_bytes", "model_bytes", "fixed_bytes", "stream_bytes",
              "batched"}
    return Figures(device=c.name, source=f"projected from {reference.device} figures and {c.name} datasheet figures",
                   policy=policy, bandwidth=c.bandwidth, bytes_per_frame=bytes_per_frame, lm_ms_cfg=lm1,
                   codec_ms=codec1, memory_bytes=c.memory_bytes, model_bytes=model_bytes[policy],
                   fixed_bytes=reference.fixed_bytes, stream_bytes=stream_bytes[policy], batched=batched,
                   projected=frozenset(fields))


def class_row(fig: Figures, price_per_hour: float | None = None) -> dict:
    """One row of the cost table for a (projected) class."""
    v = verdict(fig, HostContext(measured=False), price_per_hour)
    best = v.best
    return {
        "class": fig.device, "policy": fig.policy,
        "bandwidth_gb_s": None if fig.bandwidth is None else fig.bandwidth / 1e9,
        "bytes_per_frame": fig.bytes_per_frame, "floor_ms": v.floor_ms, "batch1_ms": v.batch1_ms,
        "rtf_batch1": v.rtf_batch1, "x_realtime_batch1": None if not v.batch1_ms else x_realtime(1, v.batch1_ms),
        "fits": v.fits, "streams_rtf_target": 0 if v.within is None else v.within.streams,
        "realtime_streams": None if best is None else best.streams,
        "x_realtime_batched": None if best is None else x_realtime(best.streams, best.step_ms),
        "price_per_hour": price_per_hour,
        "cost_per_audio_hour_batch1": v.cost.get("batch1_per_audio_hour"),
        "cost_per_audio_hour_batched": v.cost.get("batched_per_audio_hour"),
    }
