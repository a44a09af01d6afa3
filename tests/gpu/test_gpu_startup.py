"""The progressive start-up on the GPU (engine/batch_graphs.py, engine/startup.py): batch shapes compiled on a
scratch step and captured on the step's buffers, without running, on a thread of their own while streams run.

Mid-size model (full widths, few layers), seeded random weights, FP32, end of speech masked, one attention
bucket; 8 streams configured. At batch 1 in FP32 the uncompiled and the compiled step both give the eager
generator's frames exactly (test_gpu_fast_path.py), so a stream that runs alone while the other shapes build,
and crosses its own shape's compiled upgrade, must give exactly the eager frames:

- live streams during the background build (uncompiled, then compiled): every frame equal to the eager
  reference's; a second stream joins as soon as two are admitted (its join replays text-encoder shapes
  captured in the background);
- a progressive build and a whole build (the start-up before serving) of the same compiled shapes give the
  same frames for a burst of 8 streams: the background-captured graphs are the same programs;
- the real views run the code compiled on the scratch steps with no recompilation (Dynamo's guards hold);
- the codec's batches built in the background while another batch decodes give the audio the eager codec
  gives.
The figures (each piece's time, the live stream's step times during and after the build) go to
$BREEZE_GPU_FIGURES/startup_background.json.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch
from gpu_support import fp32_mid_model

from breeze_worker.config import FastPathSettings
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.measure.runner import make_request

pytestmark = pytest.mark.gpu

CAPACITY = 256
STREAMS = 8


@pytest.fixture(scope="module")
def mid_model(cuda):
    yield from fp32_mid_model(cuda, CAPACITY)


def _own_stream(device):
    return torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else contextlib.nullcontext()


def _sync(device) -> None:
    """Wait for this thread's stream only: a device-wide synchronize would also wait on the builder's stream,
    which CUDA refuses while that stream captures a graph (the worker's serving paths wait for their own
    stream in the same way)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _eager(model, request, cuda) -> list[torch.Tensor]:
    return list(EagerFrameGenerator(model, request, cuda))


class _Builder(threading.Thread):
    """What engine/startup.py's thread does for the stepper: every pending shape, on a CUDA stream of its own."""

    def __init__(self, stepper, device, gate: threading.Semaphore | None = None):
        """`gate`: wait for a permit before each piece (the test hands them out while streams are live)."""
        super().__init__(name="test-startup", daemon=True)
        self.stepper, self.device, self.gate = stepper, device, gate
        self.pieces: list[dict] = []
        self.error: BaseException | None = None

    def run(self):
        try:
            with _own_stream(self.device):
                while True:
                    if self.gate is not None:
                        self.gate.acquire()
                    t0 = time.perf_counter()
                    shape = self.stepper.build_next()
                    if shape is None:
                        return
                    self.pieces.append({"shape": list(shape), "s": time.perf_counter() - t0,
                                        "ready_streams": self.stepper.ready_streams})
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.mark.parametrize("compile", ["off", "on"])
def test_live_streams_keep_the_eager_frames_while_the_other_shapes_build(mid_model, cuda, compile, write_figures):
    """Streams join one after another (up to two at once once two are admitted) for as long as the builder
    runs, and the builder gets each piece's permit only while a stream is live (then the stream steps while the
    piece builds); each stream's frames are compared with the eager generator's for its request."""
    import itertools

    from breeze_worker.engine.batching import BatchedStepper

    settings = FastPathSettings(compile=compile)
    t0 = time.perf_counter()
    stepper = BatchedStepper(mid_model, STREAMS, cuda, eos_masked=True, settings=settings, progressive=True,
                             buckets=True)
    starter_s = time.perf_counter() - t0
    assert stepper.ready_streams == 1 and stepper.graphs.ready_shapes == ((1, 2),)
    requests = [make_request(mid_model, cfg=i % 2 == 0, frames=40, seed=50 + i) for i in range(4)]
    gate = threading.Semaphore(0)
    builder = _Builder(stepper, cuda, gate)
    frames: dict[int, list] = {}
    step_ms: dict[str, list[float]] = {"building": [], "built": []}
    live: dict[int, int] = {}  # key -> request index
    ran: dict[int, int] = {}
    keys = itertools.count()
    permits = 0
    live_at_permit: list[int] = []
    builder.start()
    while builder.is_alive() or live:
        if builder.is_alive() and len(live) < min(2, stepper.ready_streams) and stepper.free_slots > 0:
            key = next(keys)
            assert stepper.join([(key, requests[key % len(requests)])]) == {}
            live[key] = ran[key] = key % len(requests)
        if live and permits == len(builder.pieces) and builder.is_alive():
            permits += 1
            live_at_permit.append(len(live))
            gate.release()  # the next piece builds while the live streams step
        building = permits > len(builder.pieces)
        t = time.perf_counter()
        outcomes = stepper.step()
        _sync(cuda)
        step_ms["building" if building else "built"].append(1e3 * (time.perf_counter() - t))
        for key, out in outcomes.items():
            assert out.error is None, out.error
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
            if out.end_reason is not None:
                live.pop(key, None)
    builder.join()
    assert builder.error is None, repr(builder.error)
    assert stepper.graphs.complete and stepper.ready_streams == STREAMS
    assert all(live_at_permit) and len(live_at_permit) >= len(builder.pieces) + 1  # the last permit ends it
    eager = [_eager(mid_model, request, cuda) for request in requests]
    differing = {}
    for key, index in ran.items():
        bad = [i for i, (a, b) in enumerate(zip(eager[index], frames[key])) if not torch.equal(a, b)]
        if bad or len(frames[key]) != len(eager[index]):
            differing[key] = bad[:5]
    stats = stepper.stats()
    building = sorted(step_ms["building"])
    write_figures(f"startup_background_compile_{compile}", {
        "starter_s": starter_s, "pieces": builder.pieces, "compile_fallback": stats["compile_fallback"],
        "graph_fallback": stats["graph_fallback"], "fallback_steps": stats["fallback_steps"],
        "capture_recompiles": stats["capture_recompiles"], "streams_run": len(ran),
        "step_ms_building_p50": building[len(building) // 2] if building else None,
        "step_ms_building_max": building[-1] if building else None,
        "step_ms_built_p50": sorted(step_ms["built"])[len(step_ms["built"]) // 2] if step_ms["built"] else None,
        "steps_building": len(building), "differing_streams": differing})
    assert stats["compile_fallback"] is None and stats["graph_fallback"] is None
    assert stats["capture_recompiles"] == 0
    assert not differing, f"streams whose frames differ from the eager reference (first frames): {differing}"


def _burst(stepper, requests) -> list[list[torch.Tensor]]:
    assert stepper.join(list(enumerate(requests))) == {}
    frames: dict[int, list] = {}
    while len(stepper):
        for key, out in stepper.step().items():
            assert out.error is None
            if out.frame is not None:
                frames.setdefault(key, []).append(out.frame)
    return [frames[i] for i in range(len(requests))]


def test_a_progressive_build_runs_the_programs_of_a_whole_build(mid_model, cuda, write_figures):
    """Compiled: the same burst on a stepper built whole before any stream and on one built progressively (its
    shapes compiled on scratch steps and captured without running) gives the same frames; stepping every real
    view eagerly after the build compiles nothing (error_on_recompile)."""
    from torch._dynamo.utils import counters

    from breeze_worker.engine.batching import BatchedStepper
    from breeze_worker.measure.concurrency import stream_requests

    requests = stream_requests(mid_model, STREAMS, 24, 99)
    whole = BatchedStepper(mid_model, STREAMS, cuda, eos_masked=True, buckets=True, settings=FastPathSettings())
    want = _burst(whole, requests)
    del whole
    progressive = BatchedStepper(mid_model, STREAMS, cuda, eos_masked=True, buckets=True, progressive=True,
                                 settings=FastPathSettings())
    builder = _Builder(progressive, cuda)
    builder.start()
    builder.join()
    assert builder.error is None, repr(builder.error)
    got = _burst(progressive, requests)
    same = sum(torch.equal(a, b) for w, g in zip(want, got) for a, b in zip(w, g))
    total = sum(len(w) for w in want)
    unique = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for view in progressive.graphs.views.values():
            view.sample_frame()
            for bucket in progressive.graphs.buckets:
                view.backbone_step(bucket)
    _sync(cuda)
    write_figures("startup_progressive_vs_whole", {"identical_frames": same, "frames": total,
                                                   "pieces": builder.pieces,
                                                   "recompiles_on_real_views": counters["stats"]["unique_graphs"]
                                                   - unique})
    assert counters["stats"]["unique_graphs"] == unique
    assert same == total


def test_codec_batches_built_in_the_background_decode_as_the_codec_does(cuda, write_figures):
    """A stream decodes in the one-slot batch while a thread builds the 2-, 4- and 8-slot batches (tuning,
    capture); its audio agrees with the codec's own streaming decode (>= 90 dB, as test_gpu_codec.py holds the
    graphed step to), and two more streams then join into the 4-slot batch the thread built."""
    import math

    import numpy as np

    from breeze_worker.engine.codec_graphs import pool_for
    from breeze_worker.engine.codec_rows import CodecRows
    from breeze_worker.measure.models import decoder_only_codec

    # strict FP32 convolutions on both sides (the default lets cuDNN use TF32, which the graphed step's
    # tuned forms and the plain decode would use differently): the comparison is of the same arithmetic
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=False):
        codec = decoder_only_codec(seed=0, device=cuda)
        pool = pool_for(codec, compile_from=0)
        rows = CodecRows(codec)
        rows.add("a")
        generator = torch.Generator().manual_seed(5)
        codes = torch.randint(0, 2048, (24, 16), generator=generator)
        built: list[int] = []

        def build():
            with _own_stream(cuda):
                for slots in (2, 4, 8):
                    pool.ensure(slots)
                    built.append(slots)

        thread = threading.Thread(target=build)
        thread.start()
        audio = [rows.decode({"a": codes[i]})["a"] for i in range(16)]
        thread.join()
        assert built == [2, 4, 8]
        rows.add_all(["b", "c"])  # into the 4-slot batch the thread built
        assert rows.capacity == 4
        for i in range(16, 24):
            audio.append(rows.decode({"a": codes[i], "b": codes[i], "c": codes[i]})["a"])
        state = codec.new_stream(1)
        with torch.inference_mode():
            want = [codec.decode_stream(codes[i].view(1, 16, 1).to(cuda), state)[0].cpu().numpy() for i in range(24)]
    got, ref = np.concatenate(audio).astype(np.float64), np.concatenate(want).astype(np.float64)
    noise = float(((got - ref) ** 2).sum())
    snr = math.inf if noise == 0 else 10 * math.log10(float((ref ** 2).sum()) / noise)
    write_figures("startup_codec_background", {"snr_db": snr, "built": built})
    assert snr >= 90.0, snr
