"""`breeze-client bench`, run as the command a user runs (its own process), against a real in-process worker
that decodes two streams at once, with --concurrency 2: the JSON document's shape and figures that must
hold for any run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from inprocess_worker import InProcessWorker
from served_worker import ENV

from breeze_worker.config import ArtifactSettings, EngineSettings, ServerSettings, WorkerSettings

STAT_KEYS = {"mean", "stddev", "min", "max"}


def bench(target: str, *args: str) -> subprocess.CompletedProcess:
    """`breeze-client bench --target TARGET ARGS` in its own process (exit code, stdout, stderr)."""
    return subprocess.run([sys.executable, "-m", "breeze_client.cli", "bench", "--target", target, *args],
                          capture_output=True, text=True, timeout=240, env=ENV)


@pytest.fixture(scope="module")
def two_stream_worker(tmp_path_factory):
    settings = WorkerSettings(
        engine=EngineSettings(device="cpu", max_active_streams=2),
        artifacts=ArtifactSettings(directory=tmp_path_factory.mktemp("bench-artifacts")),
        server=ServerSettings(port=0, artifact_port=0),
    )
    with InProcessWorker(settings) as running:
        yield running


def test_bench_concurrency_two_json(two_stream_worker):
    run = bench(two_stream_worker.target, "--labels", "short,chunk-4.80s",
                "--frames", "3", "--warmup", "1", "--iterations", "2", "--concurrency", "2",
                "--timeout", "120", "--json", "-")
    out = run.stdout
    assert run.returncode == 0, run.stderr
    doc = json.loads(out)
    assert doc["schema"] == "breeze-client-bench/1"
    # stderr is no terminal here: each round is still reported, one line each; the table went to stderr too
    progress = [line for line in run.stderr.splitlines() if line.startswith("bench: ")]
    assert progress == [f"bench: {label}: {step}" for label in ("short", "chunk-4.80s")
                        for step in ("warm-up 1/1", "iteration 1/2 x 2 clients", "iteration 2/2 x 2 clients")]
    assert "TTFA ms" in run.stderr
    meta = doc["meta"]
    assert meta["concurrency"] == 2 and meta["iterations"] == 2 and meta["warmup"] == 1
    assert meta["worker_is_tiny_default"] is True and "frame limit" in meta["frame_limit_note"]
    assert [s["label"] for s in doc["labels"]] == ["short", "chunk-4.80s"]
    for s in doc["labels"]:
        assert s["requests"] == 4 and s["frame_limit"] == 3
        for key in ("wall_s", "audio_s", "rtf", "frames_per_s", "worker_ttfa_ms", "frames"):
            assert set(s[key]) == STAT_KEYS, key
        assert {"p50", "p90", "p99"} <= set(s["ttfa_ms"]) and {"p50", "p90", "p99", "count"} <= set(s["inter_chunk_ms"])
        assert set(s["worker_stages_s"]) == {"text_encode_s", "prefill_s", "generate_s", "codec_s"}
        frames = [r["frames"] for r in s["per_request"]]
        assert all(1 <= f <= 3 for f in frames) and set(s["end_reasons"]) <= {"frame_limit", "end_of_speech"}
        assert s["inter_chunk_ms"]["count"] == sum(f - 1 for f in frames)  # one chunk per frame
        w = s["wall_s"]
        assert 0 < w["min"] <= w["mean"] <= w["max"] and w["stddev"] >= 0
        assert s["rtf"]["mean"] == pytest.approx(
            sum(r["wall_s"] / r["audio_s"] for r in s["per_request"]) / 4)
        assert all(0 < r["ttfa_ms"] < r["wall_s"] * 1e3 for r in s["per_request"])
        for r in s["per_request"]:  # the worker's stamps split the client's TTFA: one host, one clock
            split = dict(r["ttfa_split_ms"])
            to_worker = split.pop("to_worker")  # the worker's receipt stamp: a part of to_queue
            assert sum(split.values()) == pytest.approx(r["ttfa_ms"], abs=0.01), split
            assert min(split.values()) > -0.5 and split["worker"] == pytest.approx(r["worker_ttfa_ms"], abs=0.5)
            assert -0.5 < to_worker <= split["to_queue"] + 0.01
        assert set(s["ttfa_split_ms"]) == {"to_queue", "queue", "worker", "transit", "to_worker"}
        for r in s["per_request"]:  # after the last frame: the commit (its storage calls inside it), the final message
            end = r["end_split_ms"]
            assert 0 < end["storage"] <= end["commit"] and end["to_client"] > -0.5
            assert r["wall_s"] * 1e3 > end["commit"] + end["to_client"]
        assert set(s["end_split_ms"]) == {"commit", "storage", "to_client"}
        assert all(v["p50"] <= v["p95"] <= v["max"] for v in s["end_split_ms"].values())
        assert all(v["p50"] <= v["p95"] for v in s["ttfa_split_ms"].values())
        assert s["inter_chunk_ms"]["p50"] <= s["inter_chunk_ms"]["p90"] <= s["inter_chunk_ms"]["p99"]
        assert len(s["rounds"]) == 2
        for i in range(2):  # the two clients of a round were in flight at the same time
            a, b = [r for r in s["per_request"] if r["round"] == i]
            assert a["sent_ns"] < b["final_ns"] and b["sent_ns"] < a["final_ns"]
            assert s["rounds"][i]["audio_s"] == pytest.approx(a["audio_s"] + b["audio_s"])


def test_bench_table_says_frames_are_limited(two_stream_worker):
    run = bench(two_stream_worker.target, "--labels", "chunk-4.80s", "--frames", "2",
                "--warmup", "0", "--iterations", "1", "--timeout", "120")
    assert run.returncode == 0, run.stderr
    assert "explicit frame limit" in run.stdout and "chunk-4.80s" in run.stdout
    assert "tiny default" in run.stderr


def test_unknown_label_is_refused_with_the_known_ones(two_stream_worker):
    run = bench(two_stream_worker.target, "--labels", "huge")
    assert run.returncode == 1 and run.stderr.startswith("error: INVALID_ARGUMENT: unknown label")
    assert "chunk-7.36s" in run.stderr


@pytest.fixture(scope="module")
def one_slot_worker(tmp_path_factory):
    # every engine step takes at least 25 ms, so a 40-frame job lasts ~1 s and the three clients, which
    # start within a few ms of each other, always overlap: the third meets a full slot and a full queue
    # (without this, a fast machine can finish a job before the third client's request arrives)
    import time

    from breeze_worker.engine.stepper import PerStreamStepper

    original = PerStreamStepper.step

    def slow_step(self, **kwargs):
        time.sleep(0.025)
        return original(self, **kwargs)

    patch = pytest.MonkeyPatch()
    patch.setattr(PerStreamStepper, "step", slow_step)
    settings = WorkerSettings(
        engine=EngineSettings(device="cpu", max_active_streams=1, max_queue=1),
        artifacts=ArtifactSettings(directory=tmp_path_factory.mktemp("bench-one-slot")),
        server=ServerSettings(port=0, artifact_port=0),
    )
    with InProcessWorker(settings) as running:
        yield running
    patch.undo()


def test_rejected_requests_are_reported_by_code_not_fatal(one_slot_worker):
    """1 slot and 1 queue place for 3 clients at once: the third is refused (RESOURCE_EXHAUSTED); the bench
    goes on, counts it per label and keeps it out of the statistics."""
    run = bench(one_slot_worker.target, "--labels", "chunk-4.80s", "--frames", "40",
                "--warmup", "0", "--iterations", "2", "--concurrency", "3", "--timeout", "120", "--json", "-")
    out = run.stdout
    assert run.returncode == 0, run.stderr
    s = json.loads(out)["labels"][0]
    assert s["attempted"] == 6 and s["requests"] + sum(s["errors"].values()) == 6
    assert set(s["errors"]) == {"RESOURCE_EXHAUSTED"} and s["errors"]["RESOURCE_EXHAUSTED"] >= 1
    assert len(s["failures"]) == sum(s["errors"].values()) and all(f["message"] for f in s["failures"])
    assert len(s["per_request"]) == s["requests"] >= 2 and all(r["frames"] >= 1 for r in s["per_request"])
    for i in range(2):  # every round: what completed plus what was refused is the three clients
        done = {r["client"] for r in s["per_request"] if r["round"] == i}
        refused = {f["client"] for f in s["failures"] if f["round"] == i}
        assert done | refused == {0, 1, 2} and not done & refused
    assert s["wall_s"]["min"] > 0 and s["inter_chunk_ms"]["count"] == sum(r["frames"] - 1 for r in s["per_request"])


def test_a_request_mix_sends_cfg_and_clone_requests(two_stream_worker, tmp_path):
    """--cfg-every 2 --clone-every 4 over 4 clients: client 1 instruction + CFG, client 3 a clone with an
    instruction (direction), clients 0 and 2 plain; the worker's reported template says so."""
    import subprocess

    from host_tools import need_tool

    reference = tmp_path / "ref.wav"
    subprocess.run([need_tool("espeak-ng"), "-w", str(reference), "Please call Stella."], check=True, timeout=60)
    run = bench(two_stream_worker.target, "--labels", "chunk-4.80s", "--frames", "2",
                "--warmup", "0", "--iterations", "1", "--concurrency", "4", "--cfg-every", "2",
                "--clone-every", "4", "--reference", str(reference), "--reference-text",
                "Please call Stella.", "--timeout", "120", "--json", "-")
    out = run.stdout
    assert run.returncode == 0, run.stderr
    doc = json.loads(out)
    assert doc["meta"]["request_kinds"] == {"plain": 2, "cfg": 1, "clone+cfg": 1}
    by_client = {r["client"]: r for r in doc["labels"][0]["per_request"]}
    assert {i: (r["kind"], r["template"]) for i, r in by_client.items()} == {
        0: ("plain", "plain"), 1: ("cfg", "instruction"), 2: ("plain", "plain"), 3: ("clone+cfg", "direction")}


def test_a_clone_mix_without_a_reference_is_refused(two_stream_worker):
    run = bench(two_stream_worker.target, "--clone-every", "4")
    assert run.returncode == 1 and run.stderr.startswith("error: INVALID_ARGUMENT: ") and "--reference" in run.stderr
