"""The inputs of the doctor's verdict: figures of one device, this project's recorded H200 reference, and the
datasheet figures of common GPU classes.

`Figures` holds what the verdict needs about one device, whether the doctor measured it on this host or it
was projected from the reference (`projected` names the fields that were not measured). The reference run
is data with its provenance (`source`), not a constant to tune: the doctor's own device run replaces it on the
host it runs on. Datasheet figures are the vendors' published peaks (dense, no sparsity): a floor computed
from them is a lower bound, since no kernel streams memory at the datasheet rate (the H200 copied at 4.26 of
its 4.8 TB/s).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FRAME_MS = 80.0  # audio per frame: 12.5 Hz
RTF_TARGET = 0.5  # the per-stream real-time factor the verdict counts streams against
# LM ms per frame at or below this multiple of the byte floor: what is left above the floor is at most the gap
# between a weight-streaming kernel and a plain copy (kernels seldom stream faster than 80-90% of a copy), so
# further kernel work cannot pay; only fewer bytes per frame or more bandwidth can
STOP_RATIO = 1.25
HEADROOM_FRACTION = 0.10  # GPU memory kept free when counting streams (fragmentation, the CUDA context, spikes)
# share of the datasheet half-precision tensor-core peak a batched frame step's GEMMs are assumed to reach when
# compute, not bandwidth, would bound the step (projection only; no batched step here is compute-bound)
COMPUTE_EFFICIENCY = 0.5
STREAM_LEVELS = (1, 2, 4, 8, 16, 32)  # stream counts the reference recorded; nothing is projected beyond 32


@dataclass(frozen=True)
class BatchedPoint:
    """One batched step of `streams` concurrent streams (half of them with CFG): the language model's part and
    the codec's, in ms (the worker runs them one after the other by default)."""

    streams: int
    lm_ms: float
    codec_ms: float

    @property
    def step_ms(self) -> float:
        return self.lm_ms + self.codec_ms


@dataclass(frozen=True)
class Figures:
    """What the verdict needs to know about one device. Times are per 80 ms frame, bytes are bytes.

    `lm_ms_cfg`: the fast path's language model at batch 1 with CFG (the default request shape), codec excluded;
    `codec_ms`: decoding one frame at batch 1; `bytes_per_frame`: weights one frame streams under `policy`;
    `bandwidth`: copy bandwidth (bytes read + written per second), measured or datasheet; memory figures are
    None when unknown. `projected`: names of the fields that are projections rather than measurements here."""

    device: str
    source: str
    policy: str
    bandwidth: float | None
    bytes_per_frame: int
    lm_ms_cfg: float | None = None
    lm_ms_nocfg: float | None = None
    codec_ms: float | None = None
    ttfa_ms: float | None = None
    memory_bytes: int | None = None  # the device's memory
    model_bytes: int | None = None  # language model + codec weights on the device
    fixed_bytes: int | None = None  # graphs, workspaces and activations that do not grow with streams
    stream_bytes: int | None = None  # one stream slot's caches (two rows: cond + uncond)
    batched: tuple[BatchedPoint, ...] = ()
    projected: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class ReferenceRun:
    """This project's recorded figures on one device, the base every projection starts from."""

    device: str
    source: str
    bandwidth: float  # measured copy bandwidth
    bytes_per_frame: dict[str, int]  # per policy, full-size model
    lm_ms_cfg: dict[str, float]  # batch 1, CFG on, per policy
    lm_ms_nocfg: float  # bf16
    ttfa_ms: float
    half_tflops: float  # datasheet, of the reference device
    fp32_tflops: float
    batched: tuple[BatchedPoint, ...]  # bf16, default settings
    fixed_bytes: int  # graphs, workspaces, activations at 32 streams (peak - weights - caches)
    capacity: int  # backbone positions per row when the batched figures were recorded

    def floor_ms(self, policy: str) -> float:
        return 1000.0 * self.bytes_per_frame[policy] / self.bandwidth

    def overhead_ms(self, policy: str) -> float:
        """Batch-1 LM time above the byte floor under `policy`: launch gaps, small-kernel latency, sampling."""
        return self.lm_ms_cfg[policy] - self.floor_ms(policy)

    def overhead_growth_ms(self, streams: int) -> float:
        """How much more a batched LM step of `streams` streams costs above the floor than one stream (bf16)."""
        point = next(p for p in self.batched if p.streams == streams)
        return point.lm_ms - self.batched[0].lm_ms

    def codec_growth_ms(self, streams: int) -> float:
        point = next(p for p in self.batched if p.streams == streams)
        return point.codec_ms - self.batched[0].codec_ms


H200_REFERENCE = ReferenceRun(
    device="NVIDIA H200",
    source=("this repository's measurements on an NVIDIA H200 with the full-size architecture (random weights): "
            "copy bandwidth 4.26 TB/s and the bf16 fast path at batch 1 with CFG, 7.77-7.94 ms a frame in four "
            "processes (7.90 the median), `breeze-worker bench` at commit 9165fbb "
            "(docs/perf-data/batch1-bf16-9165fbb-20261202-p1..p4.json); the fp16-mixed fast path, 9.37 ms a "
            "frame, and the bytes per frame of both policies at 435d551 "
            "(docs/perf-data/batch1-fp16mixed-435d551-20261202.json); batched steps of 1-32 streams with default "
            "settings and the FP32 codec at a72eac9 "
            "(docs/perf-data/sweep-default-a72eac9-20261202.json)"),
    bandwidth=4.26e12,
    bytes_per_frame={"bf16": 12_957_329_408, "fp16-mixed": 13_029_756_928},
    lm_ms_cfg={"bf16": 7.90, "fp16-mixed": 9.37},
    lm_ms_nocfg=6.44,
    ttfa_ms=23.5,
    half_tflops=989.0,
    fp32_tflops=67.0,
    batched=(BatchedPoint(1, 7.92, 2.71), BatchedPoint(2, 9.76, 3.17), BatchedPoint(4, 9.30, 3.50),
             BatchedPoint(8, 9.56, 4.40), BatchedPoint(16, 10.04, 6.10), BatchedPoint(32, 10.68, 9.10)),
    fixed_bytes=1_150_000_000,
    capacity=256,
)


@dataclass(frozen=True)
class GpuClass:
    """Datasheet figures of one GPU class (dense peaks; memory as sold)."""

    name: str
    bandwidth: float  # bytes/s
    memory_bytes: int
    capability: tuple[int, int]
    half_tflops: float  # FP16/BF16 tensor cores, FP32 accumulate, dense
    fp32_tflops: float  # FP32 without tensor cores (the codec's strict-FP32 convolutions)
    matches: tuple[str, ...]  # substrings of torch.cuda.get_device_name that identify it


GPU_CLASSES: tuple[GpuClass, ...] = (
    GpuClass("T4", 320e9, 16_000_000_000, (7, 5), 65.0, 8.1, ("T4",)),
    GpuClass("L4", 300e9, 24_000_000_000, (8, 9), 121.0, 30.3, ("L4",)),
    GpuClass("A10", 600e9, 24_000_000_000, (8, 6), 125.0, 31.2, ("A10", "A10G")),
    GpuClass("L40S", 864e9, 48_000_000_000, (8, 9), 362.0, 91.6, ("L40S",)),
    GpuClass("A100-80GB", 2039e9, 80_000_000_000, (8, 0), 312.0, 19.5, ("A100",)),
    GpuClass("H100-SXM", 3350e9, 80_000_000_000, (9, 0), 989.0, 67.0, ("H100",)),
    GpuClass("H200", 4800e9, 141_000_000_000, (9, 0), 989.0, 67.0, ("H200",)),
)


def gpu_class(name: str) -> GpuClass:
    """The class called `name` (case-insensitive); ValueError naming the known ones."""
    for c in GPU_CLASSES:
        if c.name.lower() == name.strip().lower():
            return c
    raise ValueError(f"unknown GPU class {name!r}; known: {', '.join(c.name for c in GPU_CLASSES)}")


def class_of_device(device_name: str) -> GpuClass | None:
    """The class one of whose markers is a whole word of a CUDA device name ("Tesla T4", "NVIDIA A100-SXM4-80GB"),
    None when none is (so "L40S" is never taken for "L4", nor "A100" for "A10")."""
    words = set(device_name.replace("-", " ").upper().split())
    return next((c for c in GPU_CLASSES if any(m.upper() in words for m in c.matches)), None)
