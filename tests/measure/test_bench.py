"""`breeze-worker bench` on the tiny model on the CPU: it runs both paths and writes its JSON schema."""

from __future__ import annotations

import json

from breeze_worker.cli import main


def test_bench_json_schema(tmp_path, capsys):
    out = tmp_path / "bench.json"
    trace = tmp_path / "bench-trace.json"
    rc = main(["--log-level", "WARNING", "bench", "--size", "tiny", "--device", "cpu", "--precision", "fp32",
               "--frames", "3", "--repeats", "1", "--cfg", "on", "--check", "--json", str(out),
               "--trace", str(trace)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "breeze-bench/1"
    assert {"device", "date", "commit", "torch", "model", "frames"} <= set(doc["meta"])
    assert [v["name"] for v in doc["variants"]] == ["eager/cfg/fp32", "fast/cfg/fp32"]
    for v in doc["variants"]:
        assert v["frames"] == 3 and v["cfg"] is True and v["precision"] == "fp32"
        assert v["ms_per_frame"] > 0 and v["rtf"] > 0 and v["ttfa_ms"] > 0
        assert {"text_encode_s", "prefill_s", "generate_s", "codec_s"} <= set(v["stages_s"])
        for key in ("peak_memory_bytes", "host_syncs_per_frame", "gpu_busy_fraction"):
            assert key in v  # None on the CPU
    fast = doc["variants"][1]
    assert fast["host_reads_per_frame"] == 1.0
    assert doc["checks"]["fp32/cfg"]["equal"] is True
    floor = doc["floor"]["fp32"]["bytes_per_frame"]
    assert floor["total"] == floor["backbone"] + 15 * floor["depth_per_step"] + floor["codebook_heads"]
    assert "fp32" in doc["targets"]
    printed = capsys.readouterr().out
    assert "fast/cfg/fp32" in printed  # the terminal table
    # memory: GPU figures are None on the CPU, the host's peak resident set is measured
    for v in doc["variants"]:
        assert v["gpu_peak_allocated_bytes"] is None and v["gpu_peak_reserved_bytes"] is None
        assert v["host_peak_rss_bytes"] > 0 and v["host_peak_scope"] in ("section", "process")
    head = next(line for line in printed.splitlines() if line.startswith("variant"))
    assert "resv GiB" in head and "RSS GiB" in head and "syncs lm+codec" in head
    # host syncs per frame on the CPU (emulated device), split into the language model's and the codec's
    eager, fast = doc["variants"]
    for v in (eager, fast):
        assert v["host_syncs_source"].startswith("emulated")
        assert v["host_syncs_per_frame_codec"] == 1.0  # the audio read (codes go up from a pinned buffer)
        assert v["host_syncs_per_frame"] == v["host_syncs_per_frame_lm"] + v["host_syncs_per_frame_codec"]
    assert fast["host_syncs_per_frame_lm"] == 1.0  # the one packed host read
    assert eager["host_syncs_per_frame_lm"] == 18.0  # as audit-syncs counts frames 1.. of the eager reference
    # --trace: each variant's first timed request (spans only) and its sync-count request (with marks)
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    marks = [e for e in events if e["ph"] == "i" and e["name"] == "gpu_sync"]
    requests = [e for e in spans if e["name"] == "request"]
    assert sorted((r["args"]["variant"], r["args"]["timed"]) for r in requests) == [
        ("eager/cfg/fp32", False), ("eager/cfg/fp32", True), ("fast/cfg/fp32", False), ("fast/cfg/fp32", True)]

    def inside(child: dict, parent: dict) -> bool:
        return parent["ts"] <= child["ts"] and child["ts"] + child.get("dur", 0) <= parent["ts"] + parent["dur"]

    for r in requests:
        held = [e["name"] for e in spans if e is not r and inside(e, r)]
        assert held.count("frame") == 3 and held.count("codec_decode") == 3 and held.count("text_encode") == 1
        assert any(inside(m, r) for m in marks) is (not r["args"]["timed"])
    assert all(any(inside(m, r) for r in requests) for m in marks)


def test_bench_times_every_variant_before_it_instruments_any(tmp_path, monkeypatch):
    """torch.profiler leaves CUPTI attached, which slows every later frame (~7% on an H200, docs/performance.md):
    the bench times every variant of every precision first, then counts syncs and profiles, reloading an
    earlier precision's model for that."""
    from breeze_worker.commands import bench

    calls = []
    for name in ("time_variant", "instrument_variant"):
        real = getattr(bench, name)

        def wrapped(variant, *args, _real=real, _name=name, **kwargs):
            calls.append((_name, variant))
            return _real(variant, *args, **kwargs)

        monkeypatch.setattr(bench, name, wrapped)
    out = tmp_path / "bench.json"
    rc = main(["--log-level", "WARNING", "bench", "--size", "tiny", "--device", "cpu", "--precision", "fp32,bf16",
               "--force-precision", "--paths", "eager,fast", "--frames", "2", "--repeats", "1", "--cfg", "off,on",
               "--json", str(out)])
    assert rc == 0
    kinds = [kind for kind, _ in calls]
    assert kinds == ["time_variant"] * 8 + ["instrument_variant"] * 8
    assert {v for _, v in calls[:8]} == {v for _, v in calls[8:]} and len({v for _, v in calls}) == 8
    doc = json.loads(out.read_text())
    assert all(v["host_syncs_per_frame_lm"] is not None for v in doc["variants"])  # every variant instrumented
    assert [v["name"] for v in doc["variants"]][:2] == ["eager/nocfg/fp32", "fast/nocfg/fp32"]
