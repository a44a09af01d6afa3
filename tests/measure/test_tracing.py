"""The span recorder (engine/tracing.py) and `breeze-worker trace`: zero cost when off, a valid Chrome trace
whose spans nest as request > text_encode, prefill, frame > backbone_step, depth_steps > depth_step, sampling,
codec_decode, emit, with a gpu_sync mark at every host sync."""

from __future__ import annotations

import json

import pytest
import torch

from breeze_worker.cli import main as worker_main
from breeze_worker.engine import tracing
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.measure.setup import make_request
from breeze_worker.measure.trace import trace_request


def test_off_records_nothing_and_allocates_no_span():
    assert tracing.active() is None
    assert tracing.span("frame") is tracing.span("prefill")  # one shared no-op
    tracing.mark("gpu_sync")
    seq = tracing.span_sequence("frame")
    seq.next(index=0)
    seq.close()
    tracer = tracing.Tracer()
    with tracing.span("outside"):
        pass
    assert tracer.events == []


def test_spans_nest_and_marks_are_instant():
    tracer = tracing.Tracer()
    with tracer.recording():
        with tracing.span("request", path="eager"):
            with tracing.span("frame", index=0):
                assert tracer.stack() == ["request", "frame"]
                tracing.mark("gpu_sync", op="item")
    assert tracing.active() is None
    doc = tracer.chrome_trace({"note": "unit"})
    spans = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    mark = next(e for e in doc["traceEvents"] if e["ph"] == "i")
    assert spans["request"]["ts"] <= spans["frame"]["ts"] <= mark["ts"]
    assert spans["frame"]["ts"] + spans["frame"]["dur"] <= spans["request"]["ts"] + spans["request"]["dur"]
    assert spans["request"]["args"] == {"path": "eager"} and mark["args"] == {"op": "item"}
    assert doc["otherData"]["note"] == "unit"


def test_eager_generator_is_unchanged_by_tracing(tiny_for_runs):
    request = make_request(tiny_for_runs, "hello there", False, 3, 7)
    plain = list(EagerFrameGenerator(tiny_for_runs, request))
    tracer = tracing.Tracer()
    with tracer.recording():
        traced = list(EagerFrameGenerator(tiny_for_runs, request))
    assert len(plain) == len(traced) == 3 and all((a == b).all() for a, b in zip(plain, traced))
    names = [e.name for e in tracer.events]
    assert names.count("frame") == 3 and names.count("depth_steps") == 3 and names.count("backbone_step") == 2


def _inside(child: dict, parent: dict) -> bool:
    return parent["ts"] <= child["ts"] and child["ts"] + child.get("dur", 0) <= parent["ts"] + parent["dur"] + 1e-3


def _parent(event: dict, spans: list[dict]) -> str | None:
    """The innermost span containing `event` (Chrome's nesting rule on one thread)."""
    holders = [s for s in spans if s is not event and _inside(event, s)]
    return min(holders, key=lambda s: s["dur"])["name"] if holders else None


def _partial_overlaps(spans: list[dict]) -> list[tuple[str, str]]:
    """Pairs of spans on one thread that overlap without one containing the other (Chrome cannot nest them)."""
    out = []
    for a in spans:
        for b in spans:
            if a is not b and a["tid"] == b["tid"] and a["ts"] < b["ts"] < a["ts"] + a["dur"] < b["ts"] + b["dur"]:
                out.append((a["name"], b["name"]))
    return out


def test_trace_command_writes_chrome_json_with_nested_spans(tmp_path, tiny_with_codec, monkeypatch):
    monkeypatch.setattr("breeze_worker.measure.setup.load_model",
                        lambda args, device, precision=None: tiny_with_codec)
    path = tmp_path / "trace.json"
    summary = tmp_path / "summary.json"
    assert worker_main(["trace", "--device", "cpu", "--frames", "3", "--path", "eager", "--trace", str(path),
                        "--json", str(summary)]) == 0
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["frames"] == 3
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e)
        if e["ph"] in ("X", "i"):
            assert isinstance(e["ts"], float) and (e["ph"] == "i" or e["dur"] >= 0)
    spans = [e for e in events if e["ph"] == "X"]
    parents: dict[str, set] = {}
    for e in spans:
        parents.setdefault(e["name"], set()).add(_parent(e, spans))
    assert parents["request"] == {None}
    assert parents["text_encode"] == parents["prefill"] == parents["frame"] == {"request"}
    for name in ("backbone_step", "depth_steps", "codec_decode", "emit"):
        assert parents[name] == {"frame"}, name
    assert parents["depth_step"] == {"depth_steps"}
    assert parents["sampling"] == {"frame", "depth_steps"}  # codebook 0 in the frame, 1..15 in the depth steps
    assert sum(1 for e in spans if e["name"] == "frame") == 3
    syncs = [e for e in events if e["ph"] == "i" and e["name"] == "gpu_sync"]
    frame_syncs = [e for e in syncs if _parent(e, spans) not in ("text_encode", "prefill", "request", None)]
    assert frame_syncs and all(e["args"]["site"].startswith("breeze_worker/") for e in syncs)
    assert any("code0.item()" in e["args"]["code"] for e in syncs)
    rows = json.loads(summary.read_text())["spans"]
    assert {r["name"] for r in rows} >= {"request", "frame", "codec_decode", "gpu_sync"}
    assert _partial_overlaps(spans) == []


@pytest.mark.parametrize("path", ["fast"])
@pytest.mark.parametrize("overlap", ["on", "off"])
def test_fast_path_trace_places_setup_and_frames(tiny_with_codec, path, overlap):
    from breeze_worker.config import FastPathSettings

    request = make_request(tiny_with_codec, "hello there", False, 2, 3)
    tracer = tracing.Tracer()
    settings = FastPathSettings(read_overlap=overlap == "on")
    assert trace_request(tiny_with_codec, request, tiny_with_codec.device, path, tracer, sync_marks=True,
                         settings=settings) == 2
    doc = tracer.chrome_trace()
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = [e["name"] for e in spans]
    assert names.count("frame") == 2 and "text_encode" in names and "prefill" in names
    assert {_parent(e, spans) for e in spans if e["name"] in ("codec_decode", "emit")} == {"frame"}
    frame_marks = [e for e in doc["traceEvents"] if e["ph"] == "i" and _parent(e, spans) == "fast_step"]
    assert {e["args"]["site"].split(":")[0] for e in frame_marks} == {"breeze_worker/engine/fastpath/graph.py"}
    # recorded once, by the generator itself, and nested: no span crosses another
    assert names.count("text_encode") == 1 and names.count("prefill") == 1 and names.count("request") == 1
    assert names.count("fast_step") == 2  # one per frame: nothing after the last frame
    assert names.count("backbone_step") == 1  # the next frame's backbone step; none after the last frame
    assert _partial_overlaps(spans) == []
    parents: dict[str, set] = {}
    for e in spans:
        parents.setdefault(e["name"], set()).add(_parent(e, spans))
    assert parents["text_encode"] == parents["prefill"] == parents["frame"] == {"request"}
    # the next frame's backbone step: queued inside the fast step, before its host read (FrameRunner.sample_frame),
    # or after the read when the overlap is off
    assert parents["fast_step"] == {"frame"}
    assert parents["backbone_step"] == ({"fast_step"} if overlap == "on" else {"frame"})
    # inside a frame (no CUDA graphs on the CPU): the frame step's own stages
    assert parents["depth_steps"] == {"fast_step"} and parents["depth_step"] == {"depth_steps"}
    assert parents["sampling"] == {"fast_step", "depth_steps"}  # codebook 0, then 1..15
    assert names.count("depth_steps") == 2 and names.count("depth_step") == 2 * 15
    assert names.count("sampling") == 2 * 16
    frames = sorted((e for e in spans if e["name"] == "frame"), key=lambda e: e["ts"])
    prefill = next(e for e in spans if e["name"] == "prefill")
    assert frames[0]["ts"] >= prefill["ts"] + prefill["dur"]  # frame 0 starts after the setup
    steps = sorted((e for e in spans if e["name"] == "fast_step"), key=lambda e: e["ts"])
    assert [e["args"]["index"] for e in steps] == [0, 1] and all(e["args"]["graph"] is False for e in steps)


def test_fast_generator_frames_are_unchanged_by_tracing(tiny_for_runs):
    from breeze_worker.engine.fastpath.generator import FastFrameGenerator

    request = make_request(tiny_for_runs, "hello there", True, 3, 11)
    plain = list(FastFrameGenerator(tiny_for_runs, request))
    tracer = tracing.Tracer()
    with tracer.recording():
        traced = list(FastFrameGenerator(tiny_for_runs, request))
    assert len(plain) == len(traced) == 3 and all(torch.equal(a, b) for a, b in zip(plain, traced))
    names = [e.name for e in tracer.events]
    assert names.count("frame") == 3 and names.count("fast_step") == 3 and names.count("depth_steps") == 3


def test_device_span_is_a_no_op_during_a_graph_capture(monkeypatch):
    cuda = torch.device("cuda")
    tracer = tracing.Tracer()
    with tracer.recording():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        with tracing.device_span(cuda, "sampling", codebook=0):
            pass
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        with tracing.device_span(cuda, "depth_step", codebook=1):
            pass
        with tracing.device_span(torch.device("cpu"), "depth_steps"):
            pass
    assert [e.name for e in tracer.events] == ["depth_step", "depth_steps"]
    assert tracing.device_span(cuda, "off") is tracing.span("off")  # no tracer: the shared no-op
