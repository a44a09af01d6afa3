"""`breeze-worker doctor` as a user runs it, on this CPU-only host: the report, its JSON schema, the exit codes
and the messages for bad input; and that it leaves nothing behind but its --json file."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from breeze_worker.cli import main
from breeze_worker.commands.doctor import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE, exit_code, parse_prices
from breeze_worker.doctor.figures import GPU_CLASSES
from breeze_worker.doctor.probes import PROBES
from breeze_worker.doctor.sandbox import CACHE_VARIABLES

ROW_KEYS = {"class", "policy", "bandwidth_gb_s", "bytes_per_frame", "floor_ms", "batch1_ms", "rtf_batch1",
            "x_realtime_batch1", "fits", "streams_rtf_target", "realtime_streams", "x_realtime_batched",
            "price_per_hour", "cost_per_audio_hour_batch1", "cost_per_audio_hour_batched"}


@pytest.fixture
def quiet_host(tmp_path, monkeypatch):
    """A working directory and a temporary-files directory of the test's own, to see what a run leaves."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    for name in CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return cwd, tmp


def test_cpu_report_json_schema_and_nothing_left_behind(quiet_host, capsys):
    cwd, tmp = quiet_host
    rc = main(["--log-level", "WARNING", "doctor", "--json", "report.json", "--price-per-hour", "T4=0.526"])
    assert rc == EXIT_OK
    assert sorted(os.listdir(cwd)) == ["report.json"] and os.listdir(tmp) == []  # the compiler caches are gone
    assert all(name not in os.environ for name in CACHE_VARIABLES)  # the environment is as it was
    doc = json.loads((cwd / "report.json").read_text())
    assert doc["schema"] == "breeze-doctor/1" and doc["exit_code"] == 0
    assert {"date", "commit", "model", "seed", "budget_s", "frames", "elapsed_s", "writes"} <= set(doc["meta"])
    assert doc["meta"]["model"] == "random-full"
    assert doc["device"]["type"] == "cpu" and doc["device"]["busy"] is False
    assert doc["policy"]["auto"] == "fp32" and [r["auto"] for r in doc["policy"]["table"]] == [
        "fp32", "fp16-mixed", "bf16"]
    # nothing measured on the CPU, and every probe says why
    assert doc["measured"] == {}
    assert [n["probe"] for n in doc["not_measured"]] == list(PROBES)
    assert all(n["why"].startswith("no CUDA device") for n in doc["not_measured"])
    assert [w["probe"] for w in doc["would_measure"]] == list(PROBES)
    # computed from the configuration: the same byte counts the H200 runs measured on the loaded model
    assert doc["model"]["bytes_per_frame"] == {"bf16": 12_957_329_408, "fp16-mixed": 13_029_756_928}
    verdict = doc["verdict"]
    assert "a T4, projected" in verdict["subject"] and verdict["policy"] == "fp16-mixed"
    assert verdict["streams_within_rtf_target"] == 0
    # projected on the CPU: a lower bound decides nothing, so the report never says "reached" or "stop"
    assert verdict["stop"]["stop"] is False and verdict["stop"]["state"] == "undecided"
    assert verdict["stop"]["measured"] is False
    assert verdict["cost"]["price_per_hour"] == 0.526 and len(verdict["lines"]) >= 4
    assert [p["streams"] for p in verdict["batched"]] == [1, 2, 4, 8, 16, 32]
    classes = doc["projections"]["classes"]
    assert [r["class"] for r in classes] == [c.name for c in GPU_CLASSES]
    assert all(ROW_KEYS <= set(r) for r in classes)
    t4 = classes[0]
    assert t4["price_per_hour"] == 0.526
    assert t4["cost_per_audio_hour_batch1"] == pytest.approx(0.526 / t4["x_realtime_batch1"])
    assert all(r["price_per_hour"] is None for r in classes[1:])
    out = capsys.readouterr().out
    assert "not measured:" in out and "verdict (a T4, projected" in out and "on a CUDA GPU the doctor measures" in out
    for probe in PROBES:
        assert f"  {probe}: no CUDA device" in out
    assert "T4         fp16-mixed" in out  # the class table
    # the T4 before and after its 16-bit options, in the document and the text
    options = doc["projections"]["t4_options"]
    assert [r["slots"] for r in options] == [6, 13, 6, 13] and [r["streams_rtf_1"] for r in options] == [4, 8, 4, 8]
    assert "projected for a 16 GB T4 (fp16-mixed), before and after the 16-bit options" in out


def test_gpu_class_and_prices(quiet_host):
    cwd, _ = quiet_host
    rc = main(["--log-level", "WARNING", "doctor", "--gpu-class", "l4", "--price-per-hour", "0.8,T4=0.526",
               "--json", "r.json"])
    assert rc == EXIT_OK
    doc = json.loads((cwd / "r.json").read_text())
    assert "a L4, projected" in doc["verdict"]["subject"] and doc["verdict"]["policy"] == "bf16"
    assert doc["verdict"]["cost"]["price_per_hour"] == 0.8  # the bare price is the subject's
    prices = {r["class"]: r["price_per_hour"] for r in doc["projections"]["classes"]}
    assert prices["T4"] == 0.526 and prices["L4"] is None


def test_checkpoint_config_is_read_without_loading(quiet_host, tmp_path):
    ckpt = tmp_path / "ckpt"
    assert main(["--log-level", "WARNING", "make-checkpoint", "--size", "tiny", str(ckpt)]) == 0
    cwd, _ = quiet_host
    assert main(["--log-level", "WARNING", "doctor", "--model", str(ckpt), "--json", "r.json"]) == EXIT_OK
    doc = json.loads((cwd / "r.json").read_text())
    assert doc["meta"]["model"] == str(ckpt)
    assert 0 < doc["model"]["bytes_per_frame"]["bf16"] < 10_000_000  # the tiny sizes, not the full ones


@pytest.mark.parametrize("argv,message", [
    (["--price-per-hour", "abc"], "'abc' is not a price"),
    (["--price-per-hour", "T4=-1"], "a price must be positive"),
    (["--price-per-hour", "1,2"], "give one bare price"),
    (["--price-per-hour", "V100=1"], "unknown GPU class 'V100'"),
    (["--gpu-class", "V100"], "known: T4, L4, A10"),
    (["--budget-s", "0"], "--budget-s must be positive"),
    (["--frames", "1"], "--frames must be 2 to 128"),
    (["--frames", "500"], "--frames must be 2 to 128"),
    (["--device", "cuda:99"], "--device cuda:99"),
])
def test_bad_input_exits_2_with_one_line(quiet_host, capsys, argv, message):
    assert main(["doctor", *argv]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("breeze-worker doctor: ") and message in err[-1]


def test_bad_model_directories_exit_2(quiet_host, tmp_path, capsys):
    assert main(["doctor", "--model", str(tmp_path / "missing")]) == EXIT_USAGE
    assert "no config.json there" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    assert main(["doctor", "--model", str(bad)]) == EXIT_USAGE
    assert "is not a Breeze TTS 2 config" in capsys.readouterr().err


def test_exit_codes_and_prices():
    assert exit_code("cpu", {"fast_path": "no CUDA device"}) == EXIT_OK
    assert exit_code("cuda", {}) == EXIT_OK
    assert exit_code("cuda", {"precision": "time budget spent"}) == EXIT_INCOMPLETE == 3
    assert parse_prices(None) == (None, {})
    assert parse_prices(" 0.9 , t4=0.526,H200=3.5 ") == (0.9, {"T4": 0.526, "H200": 3.5})
