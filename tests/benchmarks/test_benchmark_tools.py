"""The maintained measurement tools (benchmarks/) work as tools on the CPU: each says what it measures in its
--help, and the device runner, the kernel check and the serve smoke run end to end on the tiny model and
write JSON that records where they ran. Each runs as a user runs it: `python benchmarks/NAME.py`, a child
process with no install beyond the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("device_run", "engine_bench", "concurrency_sweep", "kernel_check", "serve_smoke", "retrieval_bench",
         "host_overhead", "serve_bench", "request_intake", "group_commit", "guidance_cost", "t4_policy_check")
META_KEYS = {"date", "commit", "gpu", "driver", "torch", "triton", "python"}


def tool(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BREEZE_COMMIT")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", TOOLS)
def test_each_tool_says_what_it_measures(name):
    done = tool(name, "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"benchmarks/{name}.py" in done.stdout
    assert "--json" in done.stdout or "--out" in done.stdout
    assert len(done.stdout) > 600  # the docstring: what is measured, how, and a command line


def test_the_gpu_host_wheels_script_says_what_it_fetches_and_how_to_install_it():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_host_wheels.sh"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "scripts/gpu_host_wheels.sh [DIR] [PYVER]" in done.stdout and "JSON" in done.stdout
    assert "pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl" in done.stdout
    assert not (ROOT / "--help").exists()  # --help downloads nothing into a folder of that name


def test_host_overhead_serves_the_simulated_device_through_the_real_worker(tmp_path):
    """The worker's transport, engine thread and artifact store with a simulated device: the engine thread can
    step no faster than the device (20 + 4 ms a step, one queue), and every request of the client's rounds
    completes through gRPC."""
    out = tmp_path / "host.json"
    done = tool("host_overhead", "--streams", "4", "--frames", "8", "--iterations", "1", "--join-ops", "50",
                "--join-fixed-ms", "5", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert META_KEYS <= set(doc["meta"]) and doc["tree"] == "this checkout"
    [level] = doc["levels"]
    assert level["streams"] == 4 and level["simulated_device_ms"] == 24.0 and level["steps_at_full_load"] >= 4
    assert 24.0 * 0.98 <= level["step_period_ms_median"] < 240.0
    assert level["host_ms_per_step"] == level["step_period_ms_median"] - 24.0
    assert 0 < level["aggregate_x_realtime"] <= level["device_bound_x_realtime"] * 1.05
    # a join costs at least its simulated device time: no request's first audio comes sooner
    assert level["ttfa_ms_p95"] >= level["ttfa_ms_p50"] >= 5.0 and level["worker_ttfa_ms_p95"] >= 5.0
    log = Path(level["worker_log"]).read_text()  # the worker logs at INFO, as a served one does
    assert log.count(" INFO breeze_worker.engine.service job ") >= 8  # queued: a warm-up and a timed round of 4
    assert log.count(" committed for job ") >= 8


def test_request_intake_times_each_kind_of_the_mix_in_two_trees(tmp_path):
    """This checkout against itself as the other tree: every kind of the serve mix timed in both, the ratio of
    their mix means reported. Only the figures' presence and arithmetic are checked: their values are timings,
    which depend on how busy the machine is."""
    out = tmp_path / "intake.json"
    done = tool("request_intake", "--tree", str(ROOT), "--rounds", "1", "--calls", "20", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert META_KEYS <= set(doc["meta"]) and doc["mix"] == ["plain", "cfg", "plain", "clone+cfg"]
    for name in ("this checkout", "other tree"):
        kinds = doc[name]["us_per_request"]
        assert set(kinds) == {"plain", "cfg", "clone+cfg"} and all(v > 0 for v in kinds.values())
        low, high = doc[name]["mix_mean_us_range"]
        assert low <= doc[name]["mix_mean_us"] <= high
    means = [doc[name]["mix_mean_us"] for name in ("other tree", "this checkout")]
    assert doc["other_over_this"] == pytest.approx(means[0] / means[1])
    assert "other tree / this checkout" in done.stdout


def test_group_commit_commits_whole_groups_and_times_their_steps(tmp_path):
    """Two groups of 8 artifacts, each committed whole (the tool fails on an artifact given up), the steps
    timed from the artifacts' own commit timing, and the store left empty."""
    out, store = tmp_path / "commit.json", tmp_path / "volume"
    done = tool("group_commit", "--dir", str(store), "--streams", "8", "--frames", "4", "--commits", "2",
                "--step-ms", "5", "--rounds", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert META_KEYS <= set(doc["meta"]) and (doc["streams"], doc["step_ms"]) == (8, 5)
    assert "other_over_this" not in doc
    mine = doc["this checkout"]
    low, high = mine["commit_ms_range"]
    assert 0 < low <= mine["commit_ms_median"] <= high
    assert mine["steps_ms_median"]["wav_fsync_ns"] > 0 and sum(mine["steps_ms_median"].values()) <= high
    assert not any(store.rglob("*.wav")) and not any(store.rglob("*.partial"))


def test_device_runner_writes_a_json_per_step_and_a_summary(tmp_path):
    """The GPU suite step on a host without CUDA (every test skipped with its reason), the engine bench on the
    tiny model, and a step past its time limit: recorded as failed, its process group ended, the run exits 1."""
    out = tmp_path / "run"
    done = tool("device_run", "--steps", "gpu-tests,engine-bench,sweep", "--device", "cpu", "--size", "tiny",
                "--frames", "3", "--levels", "1", "--limit", "sweep=2", "--out", str(out), "--commit", "abc123")
    assert done.returncode == 1, done.stdout[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["engine-bench.json", "gpu-tests.json", "summary.json",
                                                     "sweep.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert META_KEYS <= set(summary["meta"]) and summary["meta"]["commit"] == "abc123"
    assert [(s["step"], s["ok"]) for s in summary["steps"]] == [("gpu-tests", True), ("engine-bench", True),
                                                                ("sweep", False)]
    tests = json.loads((out / "gpu-tests.json").read_text())["result"]
    assert tests["counts"]["skipped"] == len(tests["tests"]) > 20 and tests["counts"]["passed"] == 0
    assert {t["message"] for t in tests["tests"]} == {"needs a CUDA GPU"}
    bench = json.loads((out / "engine-bench.json").read_text())
    assert bench["ok"] and bench["result"]["meta"]["commit"] == "abc123"
    assert {v["name"] for v in bench["result"]["variants"]} == {"eager/nocfg/fp32", "fast/nocfg/fp32",
                                                              "eager/cfg/fp32", "fast/cfg/fp32"}
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["timed_out"] and not sweep["ok"] and sweep["seconds"] < 30


def test_kernel_check_runs_the_kernels_torch_stages_on_the_cpu(tmp_path):
    out = tmp_path / "kernels.json"
    done = tool("kernel_check", "--device", "cpu", "--size", "tiny", "--parts", "depth,backbone,head",
                "--precision", "fp32", "--iters", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert META_KEYS <= set(doc["meta"])
    kernels = {(k["part"], k["kernel"]) for k in doc["kernels"]}
    assert ("depth", "layer_step") in kernels and ("backbone", "qk_norm_rope") in kernels and len(kernels) == 12
    # on the CPU the "kernels" are their torch stages: in FP32 they agree with themselves exactly
    assert all(k["difference"] == 0.0 for k in doc["kernels"] if k["difference"] is not None)
    assert all(k["us"] > 0 for k in doc["kernels"])


def test_serve_smoke_runs_the_product_end_to_end(tmp_path):
    out = tmp_path / "smoke.json"
    done = tool("serve_smoke", "--device", "cpu", "--frames", "4", "--json", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["worker"]["exit_code_after_sigterm"] == 0 and doc["worker"]["ready_s"] > 0
    assert set(doc["steps"]) == {"synth_plain", "synth_cfg", "fetch", "bench"}
    assert doc["steps"]["fetch"]["same_bytes_as_stream"] and doc["steps"]["fetch"]["json"]["verified"]
    assert doc["steps"]["synth_plain"]["wav"]["frames"] == 4 * 1920


def test_the_engine_sweep_runs_the_client_mix_with_clones_of_real_speech(tmp_path):
    """`breeze-worker bench --concurrency` with the serve bench's mix: every stream the given text, half with
    CFG, every 2nd from the first cloning an espeak-ng recording encoded as the worker encodes one; its
    length as soundfile reads the file (not our decoder) is what the JSON records."""
    import soundfile
    from host_tools import need_tool

    espeak = need_tool("espeak-ng")
    reference, words = tmp_path / "reference.wav", "Please call Stella. Ask her to bring these things."
    subprocess.run([espeak, "-w", str(reference), words], check=True, timeout=60)
    out = tmp_path / "sweep.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BREEZE_COMMIT")}
    done = subprocess.run([sys.executable, "-m", "breeze_worker.cli", "bench", "--device", "cpu", "--size", "tiny",
                           "--concurrency", "4", "--frames", "2", "--text", "The library opens at nine.",
                           "--clone-every", "2", "--reference", str(reference), "--reference-text", words,
                           "--json", str(out)], cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    mix = doc["meta"]["mix"]
    assert mix["text"] == "The library opens at nine." and mix["clone_every"] == 2
    assert mix["reference_seconds"] == pytest.approx(soundfile.info(str(reference)).duration, abs=1e-3)
    [row] = doc["rows"]
    assert (row["streams"], row["cfg_streams"], row["clone_streams"]) == (4, 2, 2)
    assert row["aggregate_x_realtime"] > 0


def test_stream_requests_clone_the_cfg_streams_and_speak_one_text():
    import numpy as np

    from breeze_worker.engine.types import ResolvedReference
    from breeze_worker.measure.concurrency import StreamMix, stream_requests
    from breeze_worker.model.tiny import tiny_model

    model = tiny_model(seed=0, with_codec=False)
    reference = ResolvedReference("ref-" + "1" * 32, "a reference line", np.zeros((5, 16), dtype=np.int64), 0.4)
    requests = stream_requests(model, 8, 3, 1, StreamMix(text="one text", clone_every=4, reference=reference))
    assert [r.reference is not None for r in requests] == [True, False, False, False] * 2
    assert all(r.uses_cfg for r in requests if r.reference is not None)
    assert {r.text for r in requests} == {"one text"} and sum(r.uses_cfg for r in requests) == 4
    with pytest.raises(ValueError):
        StreamMix(clone_every=2)


def test_guidance_cost_measures_one_two_and_three_rows_in_each_tree(tmp_path):
    """This checkout against itself as the other tree, on the tiny model: batch 1 with 1, 2 and 3 rows and a
    burst whose direction streams take one guidance scale, then two, every request running all its frames; the
    table comes last."""
    out = tmp_path / "guidance.json"
    done = tool("guidance_cost", "--device", "cpu", "--size", "tiny", "--frames", "3", "--repeats", "1",
                "--streams", "4", "--tree", str(ROOT), "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert META_KEYS <= set(doc["meta"]) and (doc["streams"], doc["frames"]) == (4, 3)
    for name in ("this checkout", "other tree"):
        tree = doc[name]
        assert tree["dual_cfg_served"] and not tree["timed_out"] and tree["returncode"] == 0
        assert {k: v["rows"] for k, v in tree["batch1"].items()} == {"plain": 1, "cfg": 2, "dual": 3}
        assert all(v["frames"] == 3 and v["ms_per_frame"] > 0 for v in tree["batch1"].values())
        # 4 streams: direction (2 or 3 rows), plain, CFG (2), plain
        assert {k: v["rows"] for k, v in tree["bursts"].items()} == {"single": 6, "dual": 7}
        assert all(v["frames"] == [3] and v["aggregate_x_realtime"] > 0 for v in tree["bursts"].values())
    assert not list(tmp_path.glob("part-*.json"))  # the children's partial files are gone
    last = done.stdout.strip().splitlines()
    assert last[0].startswith("guidance cost on cpu") and "batch 1 ms/frame, 3 rows (two scales)" in done.stdout
    assert last[-1].startswith("other tree:")


def test_the_t4_policy_check_runs_every_part_on_the_cpu(tmp_path):
    """The GPU tool's smoke run on the tiny model (its times mean nothing here): the precision check of both
    fp16-mixed forms, the half codec's SNR on the goldens and the model's codec, the engine and the codec timed
    with each option, the doctor's projection; one JSON (to $OUT by default) and the table last."""
    env_out = tmp_path / "out"
    env_out.mkdir()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "t4_policy_check.py"), "--device", "cpu",
                           "--size", "tiny", "--frames", "3", "--streams", "1,2", "--codec-rows", "1,2",
                           "--steps", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1",
                               "OUT": str(env_out)})
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((env_out / "t4_policy_check.json").read_text())
    assert doc["schema"] == "breeze-t4-policy-check/1" and META_KEYS <= set(doc["meta"])
    policies = doc["precision"]["policies"]
    assert set(policies) == {"fp16-mixed", "fp16-mixed-kv16"}
    assert "stored in FP16" in policies["fp16-mixed-kv16"]["recipe"]
    assert all(p["summary"]["nonfinite"] == 0 for p in policies.values())
    assert doc["precision"]["kv_ranges"]["key_max"] > 0
    for part in ("goldens", "model_teacher_frames", "model_random_codes"):
        assert doc["codec_snr"][part]["passes"], part
    assert {(r["half_kv"], r["streams"]) for r in doc["engine"]["rows"]} == {(h, n) for h in (False, True)
                                                                             for n in (1, 2)}
    by_kv = {r["half_kv"]: r["backbone_cache_bytes_per_row_position"] for r in doc["engine"]["rows"]}
    assert by_kv[False] == 2 * by_kv[True] and doc["engine"]["half_kv_refusal"] is None
    assert all(v == 1.0 for v in doc["engine"]["identical_frames_fp16_vs_fp32_cache"].values())
    assert {(r["precision"], r["rows"]) for r in doc["codec_time"]} == {(p, n) for p in ("fp32", "fp16-mixed")
                                                                        for n in (1, 2)}
    assert [o["option"] for o in doc["t4_projection"]][0] == "FP32 KV caches, FP32 codec"
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("T4 policy check on cpu") and lines[-1].startswith("  projected 16 GB T4, both")
