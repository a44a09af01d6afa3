"""benchmarks/serve_bench.py stays a working tool: a tiny synthetic checkpoint served on the CPU, one client,
a cold and a warm start, a variant with other settings, the JSON document's figures present and consistent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_serve_bench_on_the_cpu(tmp_path):
    out = tmp_path / "serve.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_bench.py"), "--make-checkpoint", "tiny",
                           "--device", "cpu", "--concurrency", "1,4", "--frames", "2", "--iterations", "1",
                           "--single-requests", "2", "--work-dir", str(tmp_path / "work"), "--out", str(out),
                           "--variant", "name=python-defaults,levels=1+4,args=--switch-interval-ms 5 --no-gc-freeze",
                           "--variant-concurrency", "4", "--keep", str(tmp_path / "kept"),
                           "--t4-projection", "--bandwidth", "1e11"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "breeze-serve-bench/1" and doc["meta"]["checkpoint"]["synthetic"] == "tiny"
    for phase in ("cold", "warm_caches"):
        startup = doc["startup"][phase]
        assert 0 < startup["load_s"] <= startup["engine_ready_s"] <= startup["process_start_to_serving_s"]
    first = doc["first_request"]
    assert len(first["all_ttfa_ms"]) == 2 and first["ratio"] > 0 and first["worker_ratio"] > 0
    assert first["worker_first_ttfa_ms"] <= first["first_ttfa_ms"]  # the worker's own figure excludes the wire
    assert [set(stages) for stages in first["worker_stages_s"]] == [
        {"text_encode_s", "prefill_s", "generate_s", "codec_s"}] * 2
    four = doc["load"]["4"]
    assert four["requests"] == 4 and four["failed"] == 0
    assert four["kinds"] == {"plain": 2, "cfg": 1, "clone+cfg": 1}  # half CFG, a quarter cloning
    assert doc["meta"]["reference"]["source"] == "espeak-ng"
    assert four["worker_cpu_s"] > 0 and four["rtf_per_stream_max"] >= four["rtf_per_stream_mean"] > 0
    assert four["ttfa_ms_p95"] >= four["ttfa_ms_p50"] > 0
    cost = four["worker_process"]  # the worker's own account of what its process cost
    assert cost["messages"] >= 4 * 2 and cost["cpu_s_per_message"] > 0
    assert 0 <= cost["engine_idle_fraction"] < 1 and cost["event_loop_lag_s_p99_at_most"] is not None
    assert cost["step_ms_mean"] > 0 and cost["gc_pauses_gen2"] == 0  # the start-up objects were frozen
    assert four["worker_ttfa_ms_p95"] >= four["worker_ttfa_ms_p50"] > 0 and four["worker_rtf_max"] > 0
    # a variant: the worker started again with other settings, warm caches, loaded at its own levels
    variant = doc["variants"]["python-defaults"]
    assert variant["spec"]["args"] == ["--switch-interval-ms", "5", "--no-gc-freeze"]
    assert variant["startup_warm"]["process_start_to_serving_s"] > 0 and list(variant["load"]) == ["1", "4"]
    assert variant["load"]["4"]["requests"] == 4 and variant["load"]["4"]["failed"] == 0
    # the T4 projection from each one-client run: this device's frame time less its byte floor, on a T4's floor
    for t4, one in ((doc["t4_projection"], doc["load"]["1"]), (variant["t4_projection"], variant["load"]["1"])):
        ms = 80.0 / one["aggregate_x_realtime"]
        assert abs(t4["measured_ms_per_frame_batch1"] - ms) < 1e-6 * ms
        assert abs(t4["t4_projected_ms_per_frame"] - (t4["t4_floor_ms"] + t4["overhead_ms"])) < 1e-9
        assert t4["device_floor_ms"] == 12.96e9 / 1e11 * 1e3
    kept = {p.name for p in (tmp_path / "kept").iterdir()}
    assert {"worker-cold.log", "worker-python-defaults-startup_warm.log", "client_bench_main_c4.json"} <= kept
    assert "garbage collector:" in (tmp_path / "kept" / "worker-cold.log").read_text()
    assert "garbage collector:" not in (tmp_path / "kept" / "worker-python-defaults-startup_warm.log").read_text()


def test_a_start_up_profile_splits_the_start_by_what_ran(tmp_path):
    """--profile-startup: py-spy samples the worker from its launch to its ready line; the JSON splits the load
    thread's time (waits included) by what ran. On the CPU the tiny worker's start is mostly imports and the
    eager warm-up: the categories must cover the engine's whole start-up, and the folded stacks are kept."""
    out = tmp_path / "serve.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_bench.py"), "--make-checkpoint", "tiny",
                           "--device", "cpu", "--concurrency", "1", "--frames", "2", "--iterations", "1",
                           "--single-requests", "2", "--work-dir", str(tmp_path / "work"), "--out", str(out),
                           "--skip-warm-start", "--profile-startup", "--keep", str(tmp_path / "kept")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    cold = json.loads(out.read_text())["startup"]["cold"]
    profile = cold["profile"]
    assert profile["file"] == "pyspy_startup_cold.folded" and (tmp_path / "kept" / profile["file"]).exists()
    loading, main = profile["load_thread_s"], profile["main_thread_s"]
    assert loading["imports"] > 0 and main["imports"] > 0  # the process's own imports, then the model's
    assert any(name.startswith("other: ") and "breeze_worker/" in name for name in loading)
    # the load thread is sampled from before the engine's start to the ready line, waits included
    assert 0.5 * cold["engine_ready_s"] <= sum(loading.values()) <= cold["process_start_to_serving_s"] + 1.0
    assert list(loading.values()) == sorted(loading.values(), reverse=True)


def test_the_clone_reference_is_the_given_file_else_espeak_else_none(tmp_path, monkeypatch):
    """A GPU host without espeak-ng gets its clone requests from --reference; with neither, the run has no
    clones and its JSON says so (meta.reference null), never a silent mix without them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "benchmarks" / "serve_bench.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec.loader.exec_module(bench)
    given = tmp_path / "me.wav"
    assert bench._reference(tmp_path, given, "Exactly what I said.") == {
        "path": str(given), "text": "Exactly what I said.", "source": "--reference"}
    with pytest.raises(SystemExit, match="--reference-text"):
        bench._reference(tmp_path, given, None)
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    assert bench._reference(tmp_path) is None


def test_a_synthetic_checkpoint_written_whole_is_reused_and_a_partial_one_rewritten(tmp_path, monkeypatch):
    """A second run in the same --work-dir reuses the checkpoint the first one finished (a rerun on a warm GPU
    host saves the write: 43 s at full size on the H200); a directory a killed run left half written is
    written again, not served."""
    import importlib.util

    from breeze_worker.model.loader import load_checkpoint
    from breeze_worker.model.synthetic import NOTICE

    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "benchmarks" / "serve_bench.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec.loader.exec_module(bench)
    path, meta = bench._synthetic_checkpoint(tmp_path, "tiny")
    assert meta["reused"] is False and meta["write_s"] > 0 and (path / NOTICE).is_file()
    written = {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*") if p.is_file()}
    again, meta = bench._synthetic_checkpoint(tmp_path, "tiny")
    assert again == path and meta["reused"] is True and "write_s" not in meta
    assert {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*") if p.is_file()} == written
    (path / NOTICE).unlink()  # as a run killed before its last file leaves it
    _, meta = bench._synthetic_checkpoint(tmp_path, "tiny")
    assert meta["reused"] is False and (path / NOTICE).is_file()
    load_checkpoint(path, device="cpu")  # the rewritten directory is a whole checkpoint


def test_the_start_up_bench_on_the_cpu(tmp_path):
    """benchmarks/startup_bench.py end to end on the tiny synthetic checkpoint: every case's SERVING and full
    capacity, the cold start's first request, burst and steady requests, the bundle built by `compile` and
    installed by a worker on empty caches (also under taskset), the baseline tree's warm start and the
    frame-time loads of both, the summary and the table."""
    out = tmp_path / "startup.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup_bench.py"), "--make-checkpoint", "tiny",
                           "--device", "cpu", "--streams", "2", "--burst", "2", "--burst-frames", "3", "--frames", "2",
                           "--single-requests", "2", "--cpus", "0", "--engine-arg=--fast-path", "--engine-arg=fast",
                           "--baseline-tree", str(ROOT), "--skip-baseline-cold", "--work-dir", str(tmp_path / "w"),
                           "--keep", str(tmp_path / "kept"), "--out", str(out)],
                          capture_output=True, text=True, timeout=1200, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    cases = doc["cases"]
    assert list(cases) == ["new-cold", "new-warm", "new-warm-cpus", "compile", "new-bundle", "new-bundle-cpus",
                           "base-warm"]
    assert doc["skipped"] == {"base-cold": "--skip-baseline-cold (base-warm uses this tree's warm caches)"}
    for name, entry in cases.items():
        assert "error" not in entry, (name, entry)
        if name != "compile":
            serving = entry["process_start_to_serving_s"]
            assert 0 < serving <= entry["all_streams_admitted_s"] <= entry["full_capacity_s"] <= entry["case_s"]
    assert cases["new-warm-cpus"]["cpus"] == "0" and cases["base-warm"]["tree"] == str(ROOT)
    assert cases["compile"]["returncode"] == 0 and cases["compile"]["bundle_mb"] > 0
    assert "compile bundle" in (tmp_path / "kept" / "worker-new-bundle.log").read_text()
    cold = cases["new-cold"]
    assert cold["first_request"]["ttfa_ms"] > 0 and cold["first_request"]["ratio"] > 0
    assert cold["burst"]["requests"] == 2 and not cold["burst"]["errors"] and cold["burst"]["worker_rtf"]["max"] > 0
    for name in ("new-warm", "base-warm"):
        assert cases[name]["load"]["1"]["requests"] == 1 and cases[name]["load"]["1"]["ms_per_frame"] > 0
    assert set(doc["summary"]["frame_time_new_over_base"]) == {"1"}
    table = proc.stdout.strip().splitlines()
    assert table[-1].startswith("frame time at 1 stream(s): new")
    assert any(line.startswith("new-bundle-cpus") for line in table)


def test_the_start_up_bench_skips_a_case_that_would_end_after_its_deadline(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("startup_bench", ROOT / "benchmarks" / "startup_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.argparse.Namespace(deadline_s=100.0, out=tmp_path / "s.json", keep=None, device="cpu", model=None,
                                    streams=2, torch_logs="", burst=2, engine_arg=[], worker_arg=[], label="x",
                                    frames=None, iterations=1, commit="c", cases=[], estimate={})
    run = bench.Run(args, tmp_path)
    run.t0 -= 50.0  # 50 s spent
    assert run.fits("new-warm", "warm") is False  # a warm start is expected to take 90 s by default
    why = json.loads(args.out.read_text())["skipped"]["new-warm"]
    assert why.startswith("deadline: ") and "~90 s more expected, --deadline-s 100" in why
    run.spent["warm"] = 20.0
    assert run.fits("new-warm", "warm") is True
    args.cases = ["new-cold"]
    assert run.fits("new-warm", "warm") is False
    assert json.loads(args.out.read_text())["skipped"]["new-warm"] == "not in --cases"
