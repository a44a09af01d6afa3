"""`breeze-worker bench` on the tiny model on the CPU: it runs both paths and writes its JSON schema."""

from __future__ import annotations

import json

from breeze_worker.cli import main


def test_bench_json_schema(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["--log-level", "WARNING", "bench", "--size", "tiny", "--device", "cpu", "--precision", "fp32",
               "--frames", "3", "--repeats", "1", "--cfg", "on", "--check", "--json", str(out)])
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
    assert "fast/cfg/fp32" in capsys.readouterr().out  # the terminal table
