"""The real commands as subprocesses: `breeze-worker serve` on port 0, then `breeze-client synth --stream`,
`fetch`, `health`, a failed call, and a graceful stop on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")),
           PYTHONUNBUFFERED="1")
READY = re.compile(r"breeze-worker ready: synthesis=(\S+):(\d+) artifacts=(\S+):(\d+) model=(.*)")


def _client(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "breeze_client.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    artifacts = tmp_path_factory.mktemp("cli-artifacts")
    proc = subprocess.Popen([sys.executable, "-m", "breeze_worker.cli", "serve", "--device", "cpu", "--port", "0",
                             "--artifact-port", "0", "--artifact-dir", str(artifacts), "--metrics-port", "0",
                             "--artifact-grace-s", "0"],  # its stop is tested, not the grace (test_drain.py)
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    stderr_lines: list[str] = []
    threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True).start()
    line = proc.stdout.readline()  # blocks until ready (or the process dies)
    match = READY.match(line.strip())
    assert match, f"no ready line, got {line!r}; stderr: {''.join(stderr_lines)[-2000:]}"
    yield proc, f"127.0.0.1:{match.group(2)}", f"127.0.0.1:{match.group(4)}", match.group(5), stderr_lines
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def test_serve_says_loudly_that_the_tiny_default_is_not_speech(served):
    _, target, _, model, stderr_lines = served
    assert "NOT speech" in model
    assert any("WARNING" in line and "NOT speech" in line for line in stderr_lines)
    metrics_line = next(line for line in stderr_lines if "metrics on http://" in line)
    url = re.search(r"(http://\S+/metrics)", metrics_line).group(1)
    with urllib.request.urlopen(url, timeout=10) as response:
        assert "breeze_frames_total" in response.read().decode()
    health = _client("health", "--target", target)
    assert health.returncode == 0, health.stderr
    assert "SERVING" in health.stdout and "NOT speech" in health.stdout


def test_synth_stream_then_fetch(served, tmp_path):
    _, target, artifact_target, _, _ = served
    out = tmp_path / "out.wav"
    synth = _client("synth", "Hello from the command line.", "--stream", "-o", str(out), "--max-frames", "6",
                    "--seed", "5", "--target", target, "--json", "-")
    assert synth.returncode == 0, synth.stderr
    report = json.loads(synth.stdout)
    assert report["job"]["seed"] == 5 and report["timing"]["ttfa_ms"] > 0 and report["stats"]["rtf"] > 0
    artifact_id = report["artifact"]["artifact_id"]
    streamed, rate = sf.read(out, dtype="int16")
    assert rate == 24000 and len(streamed) == round(report["stats"]["audio_seconds"] * 24000)
    assert report["audio_bytes"] == 2 * len(streamed)  # counted while streaming, though not collected

    fetched = tmp_path / "fetched.wav"
    fetch = _client("fetch", artifact_id, "-o", str(fetched), "--target", target, "--artifact-target",
                    artifact_target, "--compression", "zstd")
    assert fetch.returncode == 0, fetch.stderr
    for label in ("request sent", "first byte received", "last byte received", "file fsynced", "sha256 verified"):
        assert label in fetch.stdout
    again, _ = sf.read(fetched, dtype="int16")
    assert np.array_equal(again, streamed)

    human = _client("synth", "Once more.", "--max-frames", "3", "--target", target)
    assert human.returncode == 0, human.stderr
    for label in ("TTFA", "RTF", "job-", "art-"):
        assert label in human.stdout


def test_a_failed_call_exits_non_zero_with_status_and_message(served):
    _, target, _, _, _ = served
    bad = _client("synth", "", "--target", target)
    assert bad.returncode != 0 and "INVALID_ARGUMENT" in bad.stderr and "text" in bad.stderr
    missing = _client("fetch", "art-" + "0" * 32, "-o", "/dev/null", "--target", target)
    assert missing.returncode != 0 and "NOT_FOUND" in missing.stderr


def test_synth_with_two_guidance_scales(served, tmp_path):
    """Voice direction's two scales as flags: the job reports them; one of them alone is refused, naming the
    other, and the command exits non-zero."""
    _, target, _, _, _ = served
    reference = tmp_path / "tone.wav"
    t = np.arange(round(1.2 * 24000)) / 24000
    sf.write(reference, (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000)
    common = ("--ref-audio", str(reference), "--ref-text", "a steady tone", "--instruction", "calm and slow",
              "--max-frames", "3", "--seed", "4", "--target", target)
    synth = _client("synth", "Directed.", *common, "--cfg-scale-reference", "1.5", "--cfg-scale-instruction", "2",
                    "--json", "-")
    assert synth.returncode == 0, synth.stderr
    job = json.loads(synth.stdout)["job"]
    assert job["template"] == "direction" and job["cfg_scale"] == 1.0
    assert (job["cfg_scale_reference"], job["cfg_scale_instruction"]) == (1.5, 2.0)
    human = _client("synth", "Directed.", *common, "--cfg-scale-reference", "0", "--cfg-scale-instruction", "3")
    assert human.returncode == 0 and "guidance: reference 0, instruction 3" in human.stdout, human.stderr
    alone = _client("synth", "Directed.", *common, "--cfg-scale-reference", "1.5")
    assert alone.returncode == 1 and "error: INVALID_ARGUMENT: " in alone.stderr
    assert "cfg_scale_reference was set without cfg_scale_instruction" in alone.stderr


# Ctrl-C's default disposition in the client, as in a terminal: a test run started as a background job of a
# non-interactive shell ignores SIGINT, children inherit that, and Python then installs no handler. The child
# restores Python's own handler before the CLI starts. Not with a preexec_fn: that makes subprocess fork (not
# vfork) this gRPC-using process, gRPC's fork handler (grpcio 1.81 and later) restarts its poller in the child,
# and close_fds then closes the poller's epoll descriptor: a loaded run saw the child abort before it ran
INTERRUPTIBLE = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "sys.argv[0] = 'breeze-client'; runpy.run_module('breeze_client.cli', run_name='__main__')")


def test_ctrl_c_during_synth_stream_exits_130_with_a_valid_wav(served, tmp_path):
    _, target, _, _, _ = served
    out = tmp_path / "interrupted.wav"
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE, "synth", "A long sentence, cut short.",
                             "--stream", "-o", str(out), "--max-frames", "1500", "--seed", "3", "--temperature",
                             "0", "--target", target], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.stat().st_size >= 44 + 2 * 2 * 1920) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (stdout, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr, stderr
    audio, rate = sf.read(out, dtype="int16")  # the header was fixed: a valid WAV of what arrived
    assert rate == 24000 and len(audio) >= 2 * 1920  # at least the two frames seen before Ctrl-C
    assert len(audio) * 2 == out.stat().st_size - 44
    _assert_partial_wav_said(stderr, out, audio)


def _assert_partial_wav_said(stderr: str, out: Path, audio: np.ndarray) -> None:
    """stderr names the partial WAV with the seconds and bytes of audio it really holds."""
    said = re.search(rf"{re.escape(str(out))}: a partial WAV of the ([0-9.]+) s of audio that arrived \((\d+) "
                     r"bytes of audio", stderr)
    assert said, stderr
    assert int(said.group(2)) == 2 * len(audio) and said.group(1) == f"{len(audio) / 24000:.2f}"


def test_a_deadline_shorter_than_the_job_names_the_flag_and_the_partial_wav(served, tmp_path):
    """--timeout ends the stream while audio is arriving: `error: DEADLINE_EXCEEDED` says which flag to change,
    and the next line says what the WAV holds. The stream is held after its first audio by a proxy, so the
    deadline comes mid-stream however fast the worker runs."""
    from tcp_proxy import TcpProxy

    _, target, _, _, _ = served
    out = tmp_path / "late.wav"
    with TcpProxy(target, stall_after_bytes=20_000) as proxy:
        late = _client("synth", "A sentence that takes longer than its deadline.", "--stream", "-o", str(out),
                       "--max-frames", "1500", "--temperature", "0", "--seed", "4", "--target", proxy.address,
                       "--timeout", "8")
        assert proxy.stalled.is_set(), late.stderr  # the audio stopped arriving mid-stream, as meant
    assert late.returncode == 1 and "Traceback" not in late.stderr, late.stderr
    first = late.stderr.strip().splitlines()[-2]
    assert first.startswith("error: DEADLINE_EXCEEDED: ") and "--timeout 8 s" in first, late.stderr
    audio, rate = sf.read(out, dtype="int16")
    assert rate == 24000 and len(audio) > 0
    _assert_partial_wav_said(late.stderr, out, audio)


def test_the_ports_swapped_say_which_flag_takes_which(served, tmp_path):
    _, target, artifact_target, _, _ = served
    synth = _client("synth", "Hello.", "--max-frames", "2", "--target", artifact_target)
    assert synth.returncode == 1 and synth.stderr.startswith("error: UNIMPLEMENTED: "), synth.stderr
    assert "--target takes its synthesis address" in synth.stderr and "Traceback" not in synth.stderr
    fetch = _client("fetch", "art-" + "0" * 32, "-o", str(tmp_path / "x.wav"), "--target", target,
                    "--artifact-target", target)
    assert fetch.returncode == 1 and fetch.stderr.startswith("error: UNIMPLEMENTED: "), fetch.stderr
    assert "--artifact-target its artifact address" in fetch.stderr


def test_a_fetch_cut_by_its_deadline_keeps_its_bytes_and_says_how_to_continue(served, tmp_path):
    from tcp_proxy import TcpProxy

    from breeze_client.sdk import BreezeClient

    _, target, artifact_target, _, _ = served
    with BreezeClient(target, timeout_s=60) as client:
        artifact = client.synthesize("A file fetched in two goes.", max_frames=12, seed=6).artifact
    out = tmp_path / "two-goes.wav"
    with TcpProxy(artifact_target, stall_after_bytes=12_000) as proxy:
        cut = _client("fetch", artifact.artifact_id, "-o", str(out), "--chunk-size", "4096", "--target", target,
                      "--artifact-target", proxy.address, "--timeout", "5")
        assert proxy.stalled.is_set(), cut.stderr
    kept = out.stat().st_size
    assert cut.returncode == 1 and cut.stderr.startswith("error: DEADLINE_EXCEEDED: "), cut.stderr
    assert 0 < kept < artifact.size_bytes
    assert (f"{out}: the first {kept} bytes of the artifact are kept; continue with breeze-client fetch "
            f"{artifact.artifact_id} -o {out} --resume") in cut.stderr
    resumed = _client("fetch", artifact.artifact_id, "-o", str(out), "--resume", "--target", target,
                      "--artifact-target", artifact_target)
    assert resumed.returncode == 0 and "sha256 verified" in resumed.stdout, resumed.stderr
    assert out.stat().st_size == artifact.size_bytes


def test_sigterm_stops_the_worker_gracefully(served):
    proc = served[0]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def test_a_refused_precision_stops_serve_with_one_clear_line(tmp_path):
    """Emulated half precision without --force-precision: exit 1, the reason and the fix, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "breeze_worker.cli", "serve", "--device", "cpu", "--precision",
                           "bf16", "--port", "0", "--artifact-port", "0", "--artifact-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 1
    assert "the engine failed to start" in proc.stderr and "--force-precision" in proc.stderr
    assert "Traceback" not in proc.stderr and "breeze-worker ready" not in proc.stdout


def test_a_synthetic_checkpoint_is_flagged_not_speech_where_the_tiny_default_is(tmp_path):
    """make-checkpoint's files are readable by another user (a service account), and a worker serving them says
    that its audio is not speech in the ready line, the log, health and GetWorkerInfo."""
    import torch
    from served_worker import ServedWorker

    from breeze_client.sdk import BreezeClient
    from breeze_worker.model.synthetic import write_synthetic_checkpoint

    checkpoint = tmp_path / "synthetic"
    umask = os.umask(0o022)  # as make-checkpoint writes it under the usual umask
    try:
        write_synthetic_checkpoint(checkpoint, "tiny", seed=0, dtype=torch.float32)
    finally:
        os.umask(umask)
    modes = {str(p.relative_to(checkpoint)): p.stat().st_mode & 0o777 for p in checkpoint.rglob("*") if p.is_file()}
    assert "model-00001-of-00002.safetensors" in modes and "audio_tokenizer/model.safetensors" in modes
    assert set(modes.values()) == {0o644}, modes
    with ServedWorker(tmp_path / "artifacts", "--model", str(checkpoint)) as worker:
        ready = READY.match(worker.ready_line)
        assert ready and "NOT speech" in ready.group(5) and str(checkpoint) in ready.group(5)
        assert any("WARNING" in line and "SYNTHETIC checkpoint" in line and "NOT speech" in line
                   for line in worker.stderr_lines())
        with BreezeClient(worker.target, timeout_s=60) as client:
            info = client.worker_info()
        assert not info.is_tiny_default and "SYNTHETIC" in info.warning and "NOT speech" in info.warning
        health = _client("health", "--target", worker.target)
    assert health.returncode == 0, health.stderr
    assert "WARNING" in health.stdout and "NOT speech" in health.stdout

